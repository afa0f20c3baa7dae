"""Requests to a running engine: streamed greedy completions with token IDs and arrival times, the
per-rank audit, and /metrics."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from ..digests import text_sha256
from ..errors import LabError
from ..evidence import throughput
from ..evidence.record import QualityRecord, Request, sha256_ids


class EngineRequestError(LabError, RuntimeError):
    """A request to the engine failed or answered something this harness cannot read."""


def served_model(client: httpx.Client) -> str:
    data = client.get("/v1/models").json()
    try:
        return data["data"][0]["id"]
    except (KeyError, IndexError, TypeError) as e:
        raise EngineRequestError(f"/v1/models answered no model: {data!r}") from e


def stream_completion(
    client: httpx.Client, model: str, prompt: str, max_tokens: int, *, prompt_id: str = "", timeout_s: float = 300.0
) -> Request:
    """Greedy, EOS ignored, exactly `max_tokens` tokens, streamed so each chunk's arrival is timed."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    token_ids: list[int] = []
    text: list[str] = []
    times: list[float] = []
    per_chunk: list[int] = []
    prompt_ids: list[int] = []
    usage: dict[str, Any] = {}
    finish = None
    t0 = time.perf_counter()
    try:
        with client.stream("POST", "/v1/completions", json=body, timeout=timeout_s) as response:
            if response.status_code != 200:
                response.read()
                raise EngineRequestError(f"prompt {prompt_id!r}: HTTP {response.status_code}: {response.text[:500]}")
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    break
                arrived = time.perf_counter() - t0
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    ids = choice.get("token_ids") or []
                    if choice.get("prompt_token_ids"):
                        prompt_ids = choice["prompt_token_ids"]
                    if ids:
                        token_ids.extend(ids)
                        times.append(arrived)
                        per_chunk.append(len(ids))
                    text.append(choice.get("text") or "")
                    finish = choice.get("finish_reason") or finish
    except httpx.TimeoutException as e:
        raise EngineRequestError(
            f"prompt {prompt_id!r}: no complete answer within {timeout_s:.0f} s "
            f"({len(token_ids)} of {max_tokens} tokens received)"
        ) from e
    except httpx.TransportError as e:  # the server went away mid-answer: the stream was cut
        raise EngineRequestError(
            f"prompt {prompt_id!r}: the stream was cut after {len(token_ids)} of {max_tokens} "
            f"tokens ({type(e).__name__}: {e})"
        ) from e
    try:
        rate = throughput.decode_rate(times, per_chunk)
    except ValueError:
        rate = None  # fewer than two tokens, or all at once: no decode interval to measure
    full_text = "".join(text)
    details = usage.get("prompt_tokens_details") or {}
    return Request(
        prompt_id=prompt_id,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        text=full_text,
        finish_reason=finish,
        usage=usage,
        chunk_times=times,
        chunk_tokens=per_chunk,
        cached_tokens=details.get("cached_tokens"),
        token_ids_sha256=sha256_ids(token_ids),
        text_sha256=text_sha256(full_text),
        decode_rate=rate,
    )


def audit(client: httpx.Client, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """One audit per rank, from the worker extension over /collective_rpc."""
    response = client.post("/collective_rpc", json={"method": "b70lab_audit"}, timeout=timeout_s)
    if response.status_code != 200:
        raise EngineRequestError(
            f"/collective_rpc b70lab_audit: HTTP {response.status_code}: "
            f"{response.text[:500]} (is the server started with VLLM_SERVER_DEV_MODE=1 "
            f"and the b70lab worker extension?)"
        )
    results = response.json().get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise EngineRequestError(f"/collective_rpc b70lab_audit answered {str(results)[:300]}")
    return results


def metrics_text(client: httpx.Client) -> str:
    response = client.get("/metrics")
    if response.status_code != 200:
        raise EngineRequestError(f"/metrics: HTTP {response.status_code}")
    return response.text


def quality_answer(client: httpx.Client, model: str, sample, variant: str, *, timeout_s: float) -> QualityRecord:
    """One quality request, greedy, stopping at EOS like a user's request would (unlike the gate prompts).
    Any failure is recorded as the sample's error: a quality run never stops at one bad request."""
    body: dict[str, Any] = {"model": model, "max_tokens": sample.max_tokens, "temperature": 0.0}
    if sample.stop:
        body["stop"] = list(sample.stop)
    if sample.family == "tool_use":
        path = "/v1/chat/completions"
        body.update(messages=sample.messages, tools=sample.tools, tool_choice="auto")
    else:
        path = "/v1/completions"
        body["prompt"] = sample.prompt
        if variant == "guided":
            body["structured_outputs"] = {"json": sample.schema_}
    record = QualityRecord(sample_id=sample.id, family=sample.family, variant=variant)
    t0 = time.perf_counter()
    try:
        response = client.post(path, json=body, timeout=timeout_s)
        if response.status_code != 200:
            record.error = f"HTTP {response.status_code}: {response.text[:300]}"
        else:
            choice = response.json()["choices"][0]
            if sample.family == "tool_use":
                message = choice.get("message") or {}
                record.text = message.get("content") or ""
                record.tool_calls = [
                    {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or ""}
                    for c in message.get("tool_calls") or []
                ]
            else:
                record.text = choice.get("text") or ""
            record.finish_reason = choice.get("finish_reason")
            record.completion_tokens = (response.json().get("usage") or {}).get("completion_tokens")
    except httpx.HTTPError as e:
        record.error = f"{type(e).__name__}: {e}"
    except (KeyError, IndexError, TypeError, ValueError) as e:
        record.error = f"unreadable answer ({type(e).__name__}: {e})"
    record.seconds = round(time.perf_counter() - t0, 3)
    return record
