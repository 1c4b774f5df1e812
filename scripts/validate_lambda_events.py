#!/usr/bin/env python3
"""Validate Lambda events built by spillway against AWS Lambda Powertools' parser models.

Run by tests/aws_lambda.rs (events_validate_against_lambda_powertools_models).

Usage: validate_lambda_events.py DIR

Every DIR/<format>-<n>.json, <format> one of v2, v1, alb, must validate with
APIGatewayProxyEventV2Model, APIGatewayProxyEventModel or AlbModel respectively.
Prints {"validated": {format: count}, "failed": count} as JSON on standard output and
every failure on standard error. Exit status: 0 when every file validates (and there is
at least one), 1 otherwise, 2 when Powertools or pydantic is not installed (scripts/test.sh
installs aws-lambda-powertools[parser] into its virtual environment, whose python3 it puts
first on PATH).
"""

import json
import pathlib
import sys

try:
    import pydantic
    from aws_lambda_powertools.utilities.parser.models import (
        AlbModel,
        APIGatewayProxyEventModel,
        APIGatewayProxyEventV2Model,
    )
except ImportError as e:  # pragma: no cover - an environment problem
    print(
        f"cannot import the Powertools parser models ({e}); "
        "run the tests with scripts/test.sh, which installs aws-lambda-powertools[parser] "
        "into ${CARGO_TARGET_DIR:-target}/python-venv",
        file=sys.stderr,
    )
    sys.exit(2)

MODELS = {
    "v2": APIGatewayProxyEventV2Model,
    "v1": APIGatewayProxyEventModel,
    "alb": AlbModel,
}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 1
    files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
    validated: dict[str, int] = {}
    failed = 0
    for path in files:
        fmt = path.name.split("-", 1)[0]
        model = MODELS.get(fmt)
        if model is None:
            print(f"{path.name}: unknown format {fmt!r}", file=sys.stderr)
            failed += 1
            continue
        try:
            model.model_validate_json(path.read_bytes())
        except pydantic.ValidationError as e:
            print(f"{path.name}: {model.__name__}: {e}", file=sys.stderr)
            failed += 1
            continue
        validated[fmt] = validated.get(fmt, 0) + 1
    print(json.dumps({"validated": validated, "failed": failed}))
    return 0 if files and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
