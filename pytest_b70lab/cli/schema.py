"""`b70lab schema`: the JSON schema of promotion.json or of a start's evidence."""

from __future__ import annotations

import argparse
import json

SCHEMAS = ("promotion", "evidence")


def add(sub: argparse._SubParsersAction) -> None:
    schema_p = sub.add_parser(
        "schema", help="the JSON Schema of a document b70lab writes: promotion.json (what CI reads), evidence.json"
    )
    schema_p.add_argument("document", choices=SCHEMAS, help="which document")
    schema_p.set_defaults(func=_schema)


def _schema(args: argparse.Namespace) -> int:
    if args.document == "promotion":
        from ..evidence import promotion

        schema = promotion.json_schema()
    else:
        from ..evidence import record as evidence

        schema = evidence.Evidence.model_json_schema(by_alias=True)
    print(json.dumps(schema, indent=1, sort_keys=True))
    return 0
