"""The engine's command line: `python -m pytest_b70lab.vllm_entry serve MODEL ...` with the contract's
arguments (ServeConfig), over a private Unix socket or, for benchmarks, a loopback port with a key."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .environment import EXECUTOR_BACKEND

# The engine command's two module paths, recorded in every start's evidence: thin modules keep them
# (in_engine/ has the code), and tests that find engine processes by their command line use these names.
ENTRY_MODULE = "pytest_b70lab.vllm_entry"
EXTENSION_CLASS = "pytest_b70lab.worker_ext.AuditExtension"


def vllm_serve_command(model: str, socket_path: Path, args: Iterable[str], tcp: TcpListen | None = None) -> list[str]:
    where = ["--host", LOOPBACK, "--port", str(tcp.port)] if tcp else ["--uds", str(socket_path)]
    return [sys.executable, "-m", ENTRY_MODULE, "serve", model, *where, *args]


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class TcpListen:
    """Benchmark-only mode: the API on loopback TCP behind a key, for tools that speak only TCP (`vllm bench
    serve`). The gates never use it: their engine answers on a private Unix socket. The key reaches the
    server through its environment (VLLM_API_KEY), never its command line, so logs and command.txt stay
    clean of it."""

    port: int
    api_key: str

    @staticmethod
    def fresh() -> TcpListen:
        import secrets
        import socket

        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        return TcpListen(port, secrets.token_urlsafe(24))

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


@dataclass(frozen=True)
class ServeConfig:
    """The engine arguments this harness passes, and nothing else. Prefix caching and async scheduling
    are always off and one sequence runs at a time: the lab's decode measurement conditions."""

    model: str | Path
    revision: str | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "fp8"
    block_size: int = 32
    tensor_parallel: int = 1
    expert_parallel: bool = False
    draft: str | Path | None = None
    draft_revision: str | None = None
    speculative_method: str = "dflash"
    num_speculative_tokens: int = 11
    max_model_len: int = 2048
    enforce_eager: bool = False
    attention_backend: str | None = None
    seed: int = 0
    tool_call_parser: str | None = None  # e.g. "poolside_v1": auto tool choice through vLLM's parser
    chat_template: Path | None = None  # None: the tokenizer's own
    device: str = "cpu"  # "xpu": the B70 profile (executor pinned; environment in xpu_environment)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel

    @property
    def model_ref(self) -> str:
        return _model_ref(self.model)

    def args(self) -> list[str]:
        args = []
        if self.revision:
            args += ["--revision", self.revision]
        args += [
            "--dtype",
            self.dtype,
            "--kv-cache-dtype",
            self.kv_cache_dtype,
            "--block-size",
            str(self.block_size),
            "--no-enable-prefix-caching",
            "--no-async-scheduling",
            "--max-num-seqs",
            "1",
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prompt-tokens-details",
            "--seed",
            str(self.seed),
            "--tensor-parallel-size",
            str(self.tensor_parallel),
            "--worker-extension-cls",
            EXTENSION_CLASS,
        ]
        if self.expert_parallel:
            args.append("--enable-expert-parallel")
        if self.tensor_parallel > 1:  # on every platform: an installed Ray must never become the executor
            args += ["--distributed-executor-backend", EXECUTOR_BACKEND]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.attention_backend:
            args += ["--attention-backend", self.attention_backend]
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.chat_template:
            args += ["--chat-template", str(self.chat_template)]
        if self.draft is not None:
            spec = {
                "method": self.speculative_method,
                "model": _model_ref(self.draft),
                "num_speculative_tokens": self.num_speculative_tokens,
            }
            if self.draft_revision:
                spec["revision"] = self.draft_revision
            args += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        return args


def _model_ref(model: str | Path) -> str:
    """A local folder as an absolute path (the server runs in its log folder); a hub id as it is."""
    return str(Path(model).resolve()) if isinstance(model, Path) else model
