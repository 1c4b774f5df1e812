//! The command line as an operator meets it: `--version`, completions, the man page,
//! `check`, `config print`, config paths given positionally or with `-c`, listen
//! addresses by host name, a port already in use, JSON logs.

// Real processes on loopback: the shared harness's deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Proc, exe};

fn run(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("run spillway")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

#[test]
fn version_names_the_commit_and_the_features() {
    let o = run(&["--version"]);
    assert!(o.status.success());
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("spillway {}", env!("CARGO_PKG_VERSION")));
    let git = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short=12",
            "HEAD",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let has_git = Path::new(env!("CARGO_MANIFEST_DIR")).join(".git").exists();
    let expected_commit = match git {
        Some(c) if has_git => c,
        _ => "unknown".to_string(),
    };
    assert_eq!(lines[1], format!("commit: {expected_commit}"));
    let features = match (cfg!(feature = "aws"), cfg!(feature = "otlp")) {
        (true, true) => "aws,otlp",
        (true, false) => "aws",
        (false, true) => "otlp",
        (false, false) => "none",
    };
    assert_eq!(lines[2], format!("features: {features}"));
    // -V: one line with the same fields.
    let short = stdout(&run(&["-V"]));
    assert_eq!(
        short.trim(),
        format!(
            "spillway {} (commit {expected_commit}, features: {features})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// `spillway completions bash | head` and `spillway man | head`: a reader that closes the
/// pipe early ends the output quietly — exit 0, nothing on stderr (it used to panic with
/// "failed to write completion file", or fail with "Broken pipe"). The pipe's read end
/// is closed before the process starts, so every write meets a closed pipe.
#[test]
fn completions_and_man_exit_quietly_when_the_reader_closes_the_pipe() {
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["man"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let o = Command::new(exe())
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run spillway");
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "spillway {}: {:?}\n{}",
            args.join(" "),
            o.status,
            stderr(&o)
        );
    }
}

#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for sub in ["serve", "check", "sim", "cost", "completions"] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let o = run(&["man"]);
    assert!(o.status.success());
    let page = stdout(&o);
    assert!(page.contains(".TH spillway 1"), "{page}");
    assert!(page.contains("serve") && page.contains("config"));
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in [
        "spillway.1",
        "spillway-serve.1",
        "spillway-check.1",
        "spillway-config-print.1",
    ] {
        assert!(dir.path().join(page).exists(), "{page} missing");
    }
}

#[test]
fn the_config_path_may_be_positional_or_given_with_dash_c() {
    let quickstart = repo("config/quickstart.yaml");
    for args in [
        vec!["check", quickstart.as_str()],
        vec!["check", "-c", quickstart.as_str()],
        vec!["check", "--config", quickstart.as_str()],
    ] {
        let o = run(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert_eq!(stdout(&o), format!("{quickstart}: ok\n"));
    }
    // Both at once, or none for check: usage errors (exit 2).
    let o = run(&["check", quickstart.as_str(), "-c", quickstart.as_str()]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["check"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("spillway check FILE"), "{}", stderr(&o));
    // -c on the other subcommands that read a config.
    let paper = repo("config/sim/libra-paper.yaml");
    let o = run(&["cost", "-c", paper.as_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["config", "print", "-c", quickstart.as_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn check_reports_every_problem_at_its_place_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "version: 1\nlibra:\n  rho: 2\n  alpha: lots\nvm_pool:\n  type: process\n  comand: [x]\n",
    )
    .unwrap();
    let o = run(&["check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let b = bad.display();
    assert_eq!(
        stderr(&o),
        format!(
            "{b}: 4 problems:\n  {b}:3:8: libra.rho: must be in (0, 1], got 2\n  \
             {b}:4:10: libra.alpha: expected a number, found `lots`\n  \
             {b}:7:3: vm_pool.comand: unknown key (did you mean `command`?); expected one of: \
             command, health_path, boot_timeout_seconds, probe_interval_seconds, slots_per_vm\n  \
             {b}: function_tier: missing: `spillway serve` needs a function tier (type: process, \
             http or lambda) or function_zones\n"
        )
    );
}

/// A Redis URL's password stays out of what `check` and `config print` show: the error
/// that quotes the URL and the printed configuration carry `***` in its place.
#[test]
fn check_and_config_print_do_not_show_a_redis_password() {
    let dir = tempfile::tempdir().unwrap();
    let quickstart = std::fs::read_to_string(repo("config/quickstart.yaml")).unwrap();
    let with_url = |url: &str| {
        format!("{quickstart}\ncoordination:\n  type: redis\n  url: {url}\n  cluster: shop\n")
    };
    // rediss:// is refused (no TLS to Redis in this build); the error quotes the URL.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, with_url("rediss://ops:hunter2@127.0.0.1:6379/")).unwrap();
    let o = run(&["check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("coordination.url: TLS to Redis"), "{err}");
    assert!(err.contains("rediss://***@127.0.0.1:6379/"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // A valid file: config print shows the URL without its password.
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, with_url("redis://ops:hunter2@127.0.0.1:6379/")).unwrap();
    let o = run(&["config", "print", good.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("url: redis://***@127.0.0.1:6379/"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

/// The OTLP collector's header values (API keys) never show in `config print`: the
/// header names do, each value is `***`.
#[test]
fn config_print_does_not_show_the_collectors_header_values() {
    if !cfg!(feature = "otlp") {
        return; // without the feature the section is refused (tested with the feature off)
    }
    let dir = tempfile::tempdir().unwrap();
    let quickstart = std::fs::read_to_string(repo("config/quickstart.yaml")).unwrap();
    let file = dir.path().join("otlp.yaml");
    std::fs::write(
        &file,
        format!(
            "{quickstart}\ntelemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4318/v1/traces\n    \
             headers:\n      x-api-key: sk-live-4f9a2c\n"
        ),
    )
    .unwrap();
    let o = run(&["config", "print", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("x-api-key: \"***\""), "{text}");
    assert!(!text.contains("sk-live-4f9a2c"), "{text}");
}

/// A build without the `aws` feature: `check` refuses config/aws.yaml with the message
/// `serve` gives, instead of accepting a file `serve` then refuses.
#[test]
fn check_and_serve_refuse_aws_providers_alike_without_the_aws_feature() {
    if cfg!(feature = "aws") {
        return; // the AWS tests cover config/aws.yaml with the feature
    }
    let aws = repo("config/aws.yaml");
    let check = run(&["check", aws.as_str()]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        stderr(&check).contains("vm_pool.type: `ec2` needs AWS support"),
        "{}",
        stderr(&check)
    );
    let serve = run(&[
        "serve",
        aws.as_str(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(serve.status.code(), Some(1));
    assert_eq!(stderr(&serve), stderr(&check));
    // `check --sim` only reads it as a simulator config: valid.
    assert!(run(&["check", "--sim", aws.as_str()]).status.success());
}

#[test]
fn config_print_shows_every_default_and_the_cip_in_force_and_reads_back() {
    let o = run(&["config", "print", &repo("config/quickstart.yaml")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("# cost-indifference point in force: 2.000 req/s (set by libra.cip_rps; computed from pricing it would be 3.255 req/s)"),
        "{text}"
    );
    // Defaults the quickstart does not set are filled in.
    for line in [
        "  header_read_timeout_seconds: 10",
        "  max_body_bytes: 10485760",
        "  access_log: false",
        "  prewarmed_instances: 0",
        "    slots: 16",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    // What it prints is a valid config that prints the same again.
    let dir = tempfile::tempdir().unwrap();
    let printed = dir.path().join("printed.yaml");
    std::fs::write(&printed, &text).unwrap();
    let again = run(&["config", "print", printed.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&stdout(&again)), body(&text));
    // Without a file: the embedded quickstart.
    let o = run(&["config", "print"]);
    assert!(stdout(&o).starts_with("# effective configuration of the embedded quickstart"));
}

const LOCAL_CONFIG: &str = r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
vm_pool:
  type: static
  urls: ["http://127.0.0.1:9"]
function_tier:
  type: http
  url: "http://127.0.0.1:9"
  max_concurrency: 1
"#;

#[test]
fn listen_takes_a_host_name_and_startup_says_what_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(&path, LOCAL_CONFIG).unwrap();
    let p = Proc::spawn(&["serve", path.to_str().unwrap(), "--listen", "localhost:0"]);
    let start = p.wait_line("spillway starting", Duration::from_secs(30));
    assert!(
        start.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{start}"
    );
    assert!(start.contains("commit=\""), "{start}");
    assert!(start.contains("cip_rps=3.255 "), "rounded: {start}");
    assert!(
        start.contains(&format!("config={}", path.display())),
        "{start}"
    );
    assert!(
        start.contains("cip_source=computed from pricing"),
        "{start}"
    );
    let line = p.wait_line("spillway listening", Duration::from_secs(30));
    assert!(
        line.contains("proxy=127.0.0.1:"),
        "localhost resolves to 127.0.0.1: {line}"
    );
    // A name that does not resolve is a usage error naming it.
    let o = run(&["serve", "--listen", "no-port-here"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("expected HOST:PORT or IP:PORT"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_port_in_use_says_which_flag_moves_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(&path, LOCAL_CONFIG).unwrap();
    let o = run(&["serve", "-c", path.to_str().unwrap(), "--listen", &addr]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot listen on {addr} (proxy)")),
        "{err}"
    );
    assert!(
        err.contains("choose another address with --listen"),
        "{err}"
    );
    let o = run(&[
        "serve",
        "-c",
        path.to_str().unwrap(),
        "--admin-listen",
        &addr,
    ]);
    assert!(stderr(&o).contains("--admin-listen"), "{}", stderr(&o));
}

#[test]
fn json_logs_are_one_object_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(&path, LOCAL_CONFIG).unwrap();
    let p = Proc::spawn(&["--log-format", "json", "serve", path.to_str().unwrap()]);
    let line = p.wait_line("spillway listening", Duration::from_secs(30));
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["message"], "spillway listening");
    assert!(
        v["proxy"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{v}"
    );
    assert!(v["timestamp"].is_string(), "{v}");
}
