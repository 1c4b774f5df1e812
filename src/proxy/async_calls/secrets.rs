//! Credentials of stored asynchronous calls are never kept in plain text.
//!
//! A call runs later, against an upstream that may need the caller's credentials, so the
//! request's `Authorization`, `Proxy-Authorization` and `Cookie` headers are kept — sealed
//! with ChaCha20-Poly1305 (ring's AEAD, the library rustls already uses) under a 256-bit
//! key in `<state dir>/async/secret.key` (mode 0600, created with the store), with the
//! call id and header name as associated data so that a sealed value cannot be moved to
//! another call or header. A copy of `calls.redb` alone (a backup, a support bundle)
//! shows no credential; whoever can read the whole state directory can open them, as the
//! gateway does. A value that does not open (another key, damage) is dropped with a
//! warning when the call runs.
//!
//! The upstream's `Set-Cookie` is not stored at all: a result is fetched by whoever holds
//! its status URL, which need not be the caller the cookie was meant for.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// Request headers stored sealed, never in plain text (lower case).
pub const SEALED_HEADERS: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];

/// Response headers never stored (lower case).
pub const DROPPED_RESULT_HEADERS: [&str; 1] = ["set-cookie"];

/// The key file's name in the store's directory.
pub const KEY_FILE: &str = "secret.key";

/// Seals and opens credential header values. See the [module docs](self).
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

/// The key file could not be read or created.
#[derive(Debug, thiserror::Error)]
#[error("async store key {path}: {message}")]
pub struct KeyError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub message: String,
}

fn aad(call_id: &str, name: &str) -> Vec<u8> {
    format!("{call_id}\0{name}").into_bytes()
}

impl Sealer {
    /// The key of `<dir>/secret.key`, created (0600, 32 random bytes) when absent.
    ///
    /// # Errors
    /// [`KeyError`] naming the file: unreadable, not creatable, or not 32 bytes long.
    pub fn load_or_create(dir: &Path) -> Result<Self, KeyError> {
        let path = dir.join(KEY_FILE);
        let fail = |message: String| KeyError {
            path: path.clone(),
            message,
        };
        let mut key = [0u8; 32];
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        match opts.open(&path) {
            Ok(mut f) => {
                SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| fail("no random bytes from the system".into()))?;
                f.write_all(&key)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| fail(e.to_string()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut bytes = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|f| f.take(33).read_to_end(&mut bytes))
                    .map_err(|e| fail(e.to_string()))?;
                if bytes.len() != key.len() {
                    return Err(fail(format!(
                        "holds {} bytes, a key is 32 (remove it to make a new one: sealed \
                         credentials of stored calls are then dropped)",
                        bytes.len()
                    )));
                }
                key.copy_from_slice(&bytes);
            }
            Err(e) => return Err(fail(e.to_string())),
        }
        Ok(Self::from_key(&key))
    }

    /// A key that lives only in this process (a store given by a test).
    pub fn ephemeral() -> Self {
        let mut key = [0u8; 32];
        // SystemRandom fails only without an OS random source; a zero key then still
        // keeps the values out of plain text.
        let _ = SystemRandom::new().fill(&mut key);
        Self::from_key(&key)
    }

    fn from_key(key: &[u8; 32]) -> Self {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key");
        Self {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// `value` sealed for header `name` of call `call_id`: nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, call_id: &str, name: &str, value: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        let _ = self.rng.fill(&mut nonce);
        let mut out = value.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(call_id, name)),
                &mut out,
            )
            .expect("ChaCha20-Poly1305 seals any length a header has");
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&out);
        sealed
    }

    /// The value [`Self::seal`] sealed for `call_id` and `name`; `None` when it does not
    /// open (another key, another call or header, damage).
    pub fn open(&self, call_id: &str, name: &str, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad(call_id, name)), &mut buf)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_for_its_call_and_header_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = Sealer::load_or_create(dir.path()).unwrap();
        let secret = b"Bearer s3cr3t-token";
        let sealed = s.seal("c1", "authorization", secret);
        assert!(
            !sealed.windows(6).any(|w| w == b"s3cr3t"),
            "no plain text in the sealed value"
        );
        assert_eq!(s.open("c1", "authorization", &sealed).unwrap(), secret);
        assert_eq!(s.open("c2", "authorization", &sealed), None, "another call");
        assert_eq!(s.open("c1", "cookie", &sealed), None, "another header");
        // The same key file opens it again (a restart); another key does not.
        let again = Sealer::load_or_create(dir.path()).unwrap();
        assert_eq!(again.open("c1", "authorization", &sealed).unwrap(), secret);
        assert_eq!(
            Sealer::ephemeral().open("c1", "authorization", &sealed),
            None
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        let e = Sealer::load_or_create(dir.path()).err().unwrap();
        assert!(
            e.to_string().contains("secret.key") && e.to_string().contains("5 bytes"),
            "{e}"
        );
    }
}
