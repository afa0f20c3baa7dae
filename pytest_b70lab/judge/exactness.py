"""Gate 4, teacher exactness, and the token count: each prompt's tokens and text equal the FP8 teacher's
snapshot, whose identity matches this contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..contract.schema import Contract
from ..evidence.record import Evidence, Request, sha256_ids
from .rules import (
    FP8_KV_DTYPES,
    Check,
    Verdict,
    every_pass,
    request_of,
    started,
    subject,
)


def token_count(start: Evidence, prompt_id: str, contract: Contract) -> Verdict:
    """The reported completion token count equals the token IDs received, and the contract's count."""
    c = Check("token-count", subject(start.start_index, prompt=prompt_id))
    if (first := request_of(c, start, prompt_id)) is None:
        return c.done()
    c.observe(reported=first.usage.get("completion_tokens"), received=len(first.token_ids))
    c.observe(chunk_tokens=sum(first.chunk_tokens))
    n = contract.decode.tokens_per_request
    for label, r in every_pass(start, prompt_id):
        reported = r.usage.get("completion_tokens")
        c.expect(
            reported == len(r.token_ids), f"{label}: usage says {reported} tokens, {len(r.token_ids)} IDs received"
        )
        c.expect(
            sum(r.chunk_tokens) == len(r.token_ids),
            f"{label}: chunks carried {sum(r.chunk_tokens)} tokens, {len(r.token_ids)} IDs received",
        )
        c.expect(len(r.token_ids) == n, f"{label}: {len(r.token_ids)} tokens, the contract asks for {n}")
        c.expect(r.token_ids_sha256 == sha256_ids(r.token_ids), f"{label}: recorded token hash does not match the IDs")
    return c.done()


TEACHER_IDENTITY_FIELDS = (
    "kind",
    "output_digest",
    "model_digest",
    "kv_cache_dtype",
    "engine_kv_cache_dtypes",
    "engine_speculative_config",
    "engine_version",
)


def first_difference(mine: Sequence[object], theirs: Sequence[object]) -> int | None:
    """The first position where two sequences (token IDs, texts) differ (the shorter one's end counts), or
    None."""
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return None if at == len(mine) == len(theirs) else at


def _around(text: str, other: str, width: int = 30) -> tuple[str, str]:
    """Both texts around their first differing character, for a message a person can read."""
    at = first_difference(text, other)
    at = len(text) if at is None else at
    lo = max(0, at - width)
    return text[lo : at + width], other[lo : at + width]


def teacher_exactness(
    start: Evidence, prompt_id: str, contract: Contract, snapshot: dict[str, Any] | None, snapshot_file: str
) -> Verdict:
    """Token IDs and text equal the FP8 teacher's, and the snapshot is this contract's teacher: target-only,
    FP8, same engine version and target checkpoint (the draft is not part of a teacher). A missing, stale,
    non-FP8, foreign or incomplete snapshot fails."""
    from . import teacher

    c = Check("teacher-exactness", subject(start.start_index, prompt=prompt_id))
    record = teacher.RECORD_COMMAND.format(name=contract.name)
    if not started(c, start):
        return c.done()
    if not c.expect(
        snapshot is not None, f"no teacher snapshot for {prompt_id} at {snapshot_file}; record one with `{record}`"
    ):
        return c.done()
    assert snapshot is not None
    have = snapshot["teacher"]
    absent = [f for f in TEACHER_IDENTITY_FIELDS if f not in have]
    if not c.expect(
        not absent,
        f"the teacher snapshot {snapshot_file} lacks {absent}: what recorded it cannot be "
        f"told; re-record with `{record}`",
    ):
        return c.done()
    _teacher_identity_matches(c, have, teacher.identity(contract, start), snapshot_file, record)
    c.expect(snapshot.get("prompt_id") == prompt_id, f"snapshot is of prompt {snapshot.get('prompt_id')!r}")
    if request_of(c, start, prompt_id) is None:
        return c.done()
    for label, r in every_pass(start, prompt_id):
        _tokens_match_teacher(c, r, snapshot, label, snapshot_file, record)
    return c.done()


def _teacher_identity_matches(
    c: Check, have: dict[str, Any], want: dict[str, Any], snapshot_file: str, record: str
) -> None:
    """The snapshot is of a target-only FP8 teacher of this contract: output digest, target, engine."""
    c.observe(teacher_output_digest=have["output_digest"], snapshot=snapshot_file)
    c.expect(
        have["kind"] == "teacher"
        and isinstance(have["engine_speculative_config"], list)
        and not any(have["engine_speculative_config"]),
        f"the snapshot {snapshot_file} was not recorded by a target-only teacher ({have['engine_speculative_config']})",
    )
    fp8 = (
        have["kv_cache_dtype"] in FP8_KV_DTYPES
        and bool(have["engine_kv_cache_dtypes"])
        and all(d in FP8_KV_DTYPES for d in have["engine_kv_cache_dtypes"])
    )
    c.expect(
        fp8,
        f"the teacher of {snapshot_file} did not run an FP8 KV cache (contract "
        f"{have['kv_cache_dtype']!r}, engine {have['engine_kv_cache_dtypes']!r})",
    )
    c.expect(
        have["output_digest"] == want["output_digest"],
        f"stale teacher: {snapshot_file} is of a teacher with output digest {str(have['output_digest'])[:16]}..., "
        f"this contract's teacher is {want['output_digest'][:16]}... (target, engine arguments, prompts or "
        f"token count changed); re-record with `{record}`",
    )
    c.expect(
        have["model_digest"] == want["model_digest"],
        f"foreign teacher: {snapshot_file} was recorded on target checkpoint {have['model_digest']}, this run "
        f"serves target "
        f"{want['model_digest']}; re-record with `{record}`",
    )
    c.expect(
        have["engine_version"] == want["engine_version"],
        f"teacher {snapshot_file} recorded on engine {have['engine_version']}, this run is {want['engine_version']}",
    )


def _tokens_match_teacher(
    c: Check, r: Request, snapshot: dict[str, Any], prompt_id: str, snapshot_file: str, record: str
) -> None:
    """Token for token, then the hashes and the text: the first differing token is named with its context."""
    c.observe(token_ids_sha256=r.token_ids_sha256, teacher_token_ids_sha256=snapshot["token_ids_sha256"])
    ids = snapshot.get("token_ids")
    if not c.expect(
        isinstance(ids, list) and sha256_ids(ids) == snapshot["token_ids_sha256"],
        f"the teacher snapshot {snapshot_file} does not keep its token IDs (or they do not match its "
        f"hash): re-record with `{record}`",
    ):
        return
    assert isinstance(ids, list)
    c.expect(
        len(r.token_ids) == snapshot["token_count"] == len(ids),
        f"{prompt_id}: {len(r.token_ids)} tokens, the teacher produced {snapshot['token_count']}",
    )
    at = first_difference(r.token_ids, ids)
    if at is not None:
        mine, theirs = (r.token_ids[at] if at < len(r.token_ids) else None), (ids[at] if at < len(ids) else None)
        here, there = _around(r.text, snapshot.get("text", ""))
        c.observe(first_differing_token=at)
        c.expect(
            False,
            f"{prompt_id}: token IDs differ from the teacher from token {at} on (this run {mine}, "
            f"teacher {theirs}); text here {here!r}, teacher {there!r}",
        )
    c.expect(
        r.token_ids_sha256 == snapshot["token_ids_sha256"] or at is not None,
        f"{prompt_id}: token-ID hash {r.token_ids_sha256[:16]}... differs from the teacher's",
    )
    c.expect(r.text_sha256 == snapshot["text_sha256"], f"{prompt_id}: decoded text differs from the teacher")
