"""The experimental identity: one TOML file under fixtures/contracts/, validated on load, hashed.

A contract fixes what is launched (target, draft, engine arguments), what the audits must find, the
prompt set, the decode accounting and the reproduction rule. Its canonical digest travels into every
artifact. The teacher is derived, never written: the same contract with speculation removed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Protocol, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..digests import bytes_sha256, sha256_canonical
from ..errors import LabError
from . import project

# What a contract's starts are: the candidate promoted, its target-only teacher, or the unquantized-KV reference.
Kind = Literal["candidate", "teacher", "reference"]

SCHEMA_VERSION = 1
CONTRACTS = "fixtures/contracts"
SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
GIT_SHA = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]


def _stays_in_the_repository(value: str) -> str:
    """A relative path is the repository's own file: `..` may not climb out of it (a contract from elsewhere
    must not reach a file beside the checkout by accident). Absolute paths stay allowed, for models on other
    disks; the dry run and the evidence show them as they are."""
    if not Path(value).is_absolute() and ".." in Path(value).parts:
        raise ValueError(
            f"{value!r} climbs out of the repository with '..'; write the path from the repository "
            f"root, or an absolute path"
        )
    return value


REPO_PATH = Annotated[str, AfterValidator(_stays_in_the_repository)]


class ContractError(LabError, ValueError):
    """A contract or its prompt set is missing or invalid; the message names the file and the field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"a number is required, not {str(value).lower()}")
    return value


def _bool_only(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"true or false is required, not {value!r}")
    return value


# pydantic's Literal[1] also takes `true`, and Literal[False] takes 0 (True == 1, False == 0), even in strict
# mode: found by tests/unit/test_fuzz.py.
ExactlyOne = Annotated[Literal[1], BeforeValidator(_no_bool)]
Off = Annotated[Literal[False], BeforeValidator(_bool_only)]


class ModelSource(Strict):
    """Where a checkpoint comes from: the generated mini model, a local folder, or a pinned hub revision."""

    source: Literal["mini", "path", "hub"]
    path: REPO_PATH | None = None  # relative paths are relative to the repository root
    hub_id: str | None = None
    revision: GIT_SHA | None = None
    # A path model the session may make when its folder is missing: "mini-export" writes plain copies of the
    # generated mini (config, tokenizer, safetensors, no manifest) to path/.. as target/ and draft/.
    # "mini-int4-export" writes its W4A16 build instead (compressed-tensors pack-quantized, as production's
    # checkpoints are; mini/int4.py).
    if_missing: Literal["mini-export", "mini-int4-export"] | None = None

    @model_validator(mode="after")
    def _one_location(self) -> ModelSource:
        if self.source == "hub" and not (self.hub_id and self.revision):
            raise ValueError("a hub model needs hub_id and a 40-hex revision")
        if self.source == "path" and not self.path:
            raise ValueError("a path model needs path")
        if self.source == "mini" and (self.path or self.hub_id or self.revision):
            raise ValueError("a mini model takes no path, hub_id or revision")
        if self.if_missing and self.source != "path":
            raise ValueError("if_missing applies to a path model only")
        if self.if_missing and Path(self.path or "").name not in ("target", "draft"):
            raise ValueError("a mini-export path ends in /target or /draft (the export writes both)")
        return self


class Engine(Strict):
    device: Literal["cpu", "xpu"]
    # No "auto": the contract is the identity of the experiment, and the launch-flags gate compares this
    # with what the engine resolved.
    dtype: Literal["float32", "bfloat16", "float16"]
    # "auto" only in the derived unquantized-KV reference (Contract.unquantized_kv_reference), never written.
    kv_cache_dtype: Literal["fp8", "fp8_e4m3", "auto"]
    block_size: int = Field(gt=0, multiple_of=16)
    tensor_parallel: int = Field(ge=1)
    expert_parallel: bool
    # The lab's measurement conditions are fixed; the fields exist so that the contract says so.
    enable_prefix_caching: Off
    async_scheduling: Off
    max_num_seqs: ExactlyOne
    calculate_kv_scales: Off
    max_model_len: int = Field(gt=0)
    compile_mode: Literal["compiled", "eager"]
    attention_backend: str | None = None
    seed: int = 0


class Speculative(Strict):
    method: Literal["dflash"]
    num_speculative_tokens: int = Field(ge=1)
    verify_width: int = Field(ge=2)

    @model_validator(mode="after")
    def _width(self) -> Speculative:
        if self.verify_width != self.num_speculative_tokens + 1:
            raise ValueError(
                f"verify_width {self.verify_width} must be num_speculative_tokens + 1 "
                f"({self.num_speculative_tokens + 1})"
            )
        return self


FP8_ATTENTION_DEFAULT: Final = "either"


class Expect(Strict):
    """What the per-rank audits must find."""

    target_kv_scale_count: int = Field(gt=0)
    target_kv_scale_digest: SHA256
    draft_unit_scale_layers: int = Field(ge=0)
    attention_backend: str
    compile_graphs: int = Field(ge=0)
    compile_breaks: int = Field(ge=0)
    # Checkpoint tensors (names or fnmatch patterns) that no engine parameter is made of, each with the
    # reason: the load audit fails on any other uncovered tensor.
    load_audit_exempt: dict[str, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)
    # Which FP8 attention implementation a rank may run (its audit's fp8_attention, judged by gate 3): vLLM's
    # own ops ("native"), the package's portable path for CPUs without AVX-512 ("portable"), or "either". Left
    # out of the canonical form while "either", so contracts written before it keep their digests.
    fp8_attention: Literal["native", "portable", "either"] = FP8_ATTENTION_DEFAULT
    # Which INT4 weight path every rank's INT4 layers must run (the audit's int4, judged by gate 3): vLLM's own
    # kernels ("native"), the package's portable path ("portable": the launch also asks for it everywhere, so
    # both kinds of CPU compute the same numbers), or "either". Unset for a contract that serves no INT4
    # weights on CPU, and then left out of the canonical form.
    int4_path: Literal["native", "portable", "either"] | None = None
    # The fewest draft tokens the target must accept per draft over a start (vLLM's counters, judged by
    # spec-counters): a draft that no longer predicts its target keeps every token exact and quietly costs
    # speed. Unset: not judged, and left out of the canonical form.
    min_accepted_per_draft: float | None = Field(default=None, ge=0)


class Prompts(Strict):
    file: REPO_PATH
    version: int = Field(ge=1)
    sha256: SHA256
    count: int = Field(gt=0)


class Decode(Strict):
    tokens_per_request: int = Field(ge=2)


class Reproduction(Strict):
    fresh_starts: int = Field(ge=1)
    throughput_tolerance: float = Field(gt=0, lt=1)  # how far a later start's endpoint median may move
    # How far the paired figure (throughput.paired_ratio: the geometric mean of per-prompt start-N / start-1
    # ratios) may move from 1. Absent: throughput_tolerance, and left out of the canonical form so that
    # contracts written before it keep their digests.
    paired_tolerance: float | None = Field(default=None, gt=0, lt=1)
    # How the starts are measured. "sequential": each start serves the prompts in turn and is torn down before
    # the next one launches. "interleaved": every start is alive together and each prompt goes to them in a
    # balanced order (A B, B A, ...), one request at a time, each once the other start is quiet, `passes` times
    # over: slow drift of a shared machine falls on both alike (engine/interleave.py). Both left out of the
    # canonical form at their defaults, so contracts written before them keep their digests.
    schedule: Literal["sequential", "interleaved"] = "sequential"
    passes: int = Field(default=1, ge=1, le=50)  # with max_passes: the minimum
    # How gate 7 judges speed. "point": each figure within its tolerance (the paired figure's interval is printed,
    # not judged). "equivalence": each figure's 90 % interval wholly inside [1 - T, 1 + T] (two one-sided tests at
    # 5 %): the paired figure's by Student's t over prompts, the endpoint medians' ratio's by a bootstrap over
    # prompts. Left out of the canonical form at "point", so that the contracts before it keep their digests.
    speed_rule: Literal["point", "equivalence"] = "point"
    # Interleaved under the equivalence rule: after `passes`, the session adds passes while the paired interval
    # is neither inside the band nor wholly outside it, up to max_passes (evidence/sampling.py: the stopping
    # rule, recomputed by gate 7). Absent: exactly `passes`.
    max_passes: int | None = Field(default=None, ge=1, le=50)

    @property
    def paired(self) -> float:
        return self.throughput_tolerance if self.paired_tolerance is None else self.paired_tolerance

    @property
    def alive_together(self) -> int:
        """How many starts of this contract run at once (what memory and /dev/shm must hold)."""
        return self.fresh_starts if self.schedule == "interleaved" else 1

    @model_validator(mode="after")
    def _schedule(self) -> Reproduction:
        # One start is the candidate's problem (Contract._consistent says so); more than two cannot alternate.
        if self.schedule == "interleaved" and self.fresh_starts > 2:
            raise ValueError(
                f'reproduction.schedule "interleaved" alternates two starts; fresh_starts is {self.fresh_starts}'
            )
        if self.schedule == "sequential" and self.passes != 1:
            raise ValueError(
                f"reproduction.passes is {self.passes}: repeated passes belong to the interleaved schedule "
                f"(a sequential start serves each prompt once)"
            )
        if self.max_passes is not None:
            if self.schedule != "interleaved" or self.speed_rule != "equivalence":
                raise ValueError(
                    f"reproduction.max_passes is {self.max_passes}: passes are added only by an interleaved "
                    f'schedule under speed_rule "equivalence" (this contract: {self.schedule}, {self.speed_rule!r})'
                )
            if self.max_passes < self.passes:
                raise ValueError(
                    f"reproduction.max_passes is {self.max_passes}, below passes ({self.passes}, the minimum)"
                )
        return self

    @property
    def pass_range(self) -> tuple[int, int]:
        """The fewest and the most passes a session of this contract serves."""
        return self.passes, self.max_passes or self.passes


class Deadlines(Strict):
    start_s: float = Field(gt=0)
    request_s: float = Field(gt=0)


class Chat(Strict):
    """Settings of /v1/chat/completions: they decide how tool calls are rendered and parsed, not the tokens
    of the gate prompts (so they are part of the contract's digest, not of its output digest)."""

    tool_call_parser: str | None = None  # e.g. "poolside_v1": launched with --enable-auto-tool-choice
    chat_template: REPO_PATH | None = None  # a file (relative to the repository root); None: the tokenizer's own


class Quality(Strict):
    """Gate 8: the quality prompt set (pinned like the gate prompts) and the tolerances, fixed before any
    candidate is judged. A figure regresses when an exact paired binomial test says the candidate lost
    more samples than chance explains, at `alpha` (quality/judge.py)."""

    file: REPO_PATH
    version: int = Field(ge=1)
    sha256: SHA256
    count: int = Field(gt=0)
    alpha: float = Field(gt=0, lt=0.5)
    repetition_ngram: int = Field(default=4, ge=2)
    max_repetition_rate: float = Field(default=0.5, gt=0, le=1)
    max_repeated_span: int = Field(default=16, ge=1)
    request_s: float = Field(default=120, gt=0)
    # The same target without its KV scheme, served with --kv-cache-dtype auto, to show what FP8 KV costs
    # ("auto" alone stays FP8 when the checkpoint declares a scheme). A mini source means the build's
    # plain reference checkpoint.
    unquantized_kv_target: ModelSource | None = None


class Contract(Strict):
    schema_version: ExactlyOne
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    description: str
    kind: Kind = "candidate"
    target: ModelSource
    draft: ModelSource | None = None
    engine: Engine
    speculative: Speculative | None = None
    expect: Expect
    prompts: Prompts
    decode: Decode
    reproduction: Reproduction
    deadlines: Deadlines
    chat: Chat | None = None
    quality: Quality | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Contract:
        if (self.engine.kv_cache_dtype == "auto") != (self.kind == "reference"):
            raise ValueError(
                f"engine.kv_cache_dtype {self.engine.kv_cache_dtype!r}: the lab measures FP8 KV; "
                f'"auto" is only for the derived unquantized-KV reference'
            )
        if (self.draft is None) != (self.speculative is None):
            raise ValueError("draft and speculative go together: both present or both absent")
        floor = self.expect.min_accepted_per_draft
        if floor is not None and (self.speculative is None or floor > self.speculative.num_speculative_tokens):
            raise ValueError(
                f"expect.min_accepted_per_draft {floor:g} needs speculative decoding with at least that many "
                f"speculative tokens (a draft can have at most num_speculative_tokens accepted)"
            )
        if self.target.source == "mini" and self.draft is not None and self.draft.source != "mini":
            raise ValueError("a mini target pairs with the mini draft")
        if self.kind == "candidate" and self.reproduction.fresh_starts < 2:
            raise ValueError(
                f"reproduction.fresh_starts is {self.reproduction.fresh_starts}: a candidate needs at "
                f"least 2 fresh starts (the fresh-start reproduction gate compares them)"
            )
        return self

    def canonical(self) -> dict[str, Any]:
        # Tables added later are left out while absent: a contract without them keeps the digest it had,
        # and evidence recorded before them still replays.
        exclude: dict[str, Any] = {k: True for k in ("chat", "quality") if getattr(self, k) is None}
        left_out_expect = {"fp8_attention"} if self.expect.fp8_attention == FP8_ATTENTION_DEFAULT else set()
        if self.expect.int4_path is None:
            left_out_expect.add("int4_path")
        if self.expect.min_accepted_per_draft is None:
            left_out_expect.add("min_accepted_per_draft")
        if left_out_expect:
            exclude["expect"] = left_out_expect
        defaults = {
            "paired_tolerance": None,
            "schedule": "sequential",
            "passes": 1,
            "speed_rule": "point",
            "max_passes": None,
        }
        if left_out := {k for k, v in defaults.items() if getattr(self.reproduction, k) == v}:
            exclude["reproduction"] = left_out
        return self.model_dump(mode="json", exclude=exclude)

    @property
    def digest(self) -> str:
        return sha256_canonical(self.canonical())

    @property
    def output_digest(self) -> str:
        """Digest of what determines the generated tokens: models, engine arguments, prompts, token count.
        A teacher snapshot is keyed by this, so changing a gate tolerance does not make teachers stale."""
        c = self.canonical()
        part = {k: c[k] for k in ("target", "draft", "speculative", "engine", "prompts", "decode")}
        return sha256_canonical(part)

    def teacher(self) -> Contract:
        """The same experiment without speculation: target-only, same parallel layout, KV dtype and compile
        mode (greedy output across layouts can differ at exact ties, so the teacher must share them)."""
        if self.kind == "teacher":
            return self
        data = self.canonical()
        data.update(
            name=f"{self.name}-teacher",
            kind="teacher",
            draft=None,
            speculative=None,
            description=f"teacher of {self.name}: target only",
        )
        data["expect"] = {**data["expect"], "draft_unit_scale_layers": 0}
        data["expect"].pop("min_accepted_per_draft", None)
        # A teacher is recorded, not raced: its starts run one after the other whatever the candidate's schedule.
        recorded_only = ("schedule", "passes", "speed_rule", "max_passes")
        data["reproduction"] = {k: v for k, v in data["reproduction"].items() if k not in recorded_only}
        if self.draft is not None and self.engine.device == "cpu":
            # vLLM's CPU build traces each model's forward as one graph (no piecewise split): one of the
            # candidate's compiled graphs is the draft's, which the target alone does not have.
            data["expect"]["compile_graphs"] = max(0, data["expect"]["compile_graphs"] - 1)
        return Contract.model_validate(data, strict=False)

    def unquantized_kv_reference(self) -> Contract:
        """The teacher served from the target without its KV scheme and --kv-cache-dtype auto: what the
        quality baseline costs in FP8 KV. Needs quality.unquantized_kv_target."""
        if self.quality is None or self.quality.unquantized_kv_target is None:
            raise ContractError(f"contract {self.name} names no quality.unquantized_kv_target")
        data = self.teacher().canonical()
        data.update(
            name=f"{self.name}-unquantized-kv",
            kind="reference",
            target=self.quality.unquantized_kv_target.model_dump(mode="json"),
            description=f"unquantized-KV reference of {self.name}: target only, no KV scheme",
        )
        data["engine"] = {**data["engine"], "kv_cache_dtype": "auto"}
        return Contract.model_validate(data, strict=False)

    @field_validator("description")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


class Prompt(Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    prompt: str = Field(min_length=1)
    category: str = "general"


def format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(
            f"  {where}: {e['msg']}"
            + (f" (got {e['input']!r})" if e["type"] != "missing" and not isinstance(e["input"], dict) else "")
        )
    return "\n".join(lines)


def resolve_path(name_or_path: str | Path) -> Path:
    """A contract name (fixtures/contracts/NAME.toml) or a path to a TOML file."""
    p = Path(name_or_path)
    # A folder of the working directory named like a contract (a run folder, a bundle's copy) is not one.
    if p.suffix == ".toml" or p.is_file():
        return p.resolve()
    candidate = project.find(f"{CONTRACTS}/{name_or_path}.toml")
    if candidate.exists():
        return candidate
    known = ", ".join(available()) or "none"
    where = " or ".join(str(base / CONTRACTS) for base in project.bases())
    raise ContractError(f"no contract named {name_or_path!r} (looked in {where}); known: {known}")


def load(name_or_path: str | Path) -> Contract:
    path = resolve_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ContractError(f"contract file {path} does not exist") from e
    except OSError as e:
        raise ContractError(f"contract file {path} cannot be read: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ContractError(f"contract {path} is not valid TOML: {e}") from e
    try:
        contract = Contract.model_validate(raw)
    except ValidationError as e:
        raise ContractError(f"contract {path} is invalid:\n{format_errors(e)}") from e
    load_prompts(contract)  # the pinned prompt set must exist and match, or the contract is unusable
    return contract


def repo_path(file: str) -> Path:
    """A file a contract names: relative paths are relative to the lab's repository (where fixtures/ is;
    see pytest_b70lab.contract.project)."""
    return project.find(file)


def prompts_path(contract: Contract) -> Path:
    return repo_path(contract.prompts.file)


def load_prompts(contract: Contract, fallback: Path | None = None) -> list[Prompt]:
    """The contract's pinned prompt set; `fallback` (a run folder's copy) is read where the contract's own
    file is not on this machine, and held to the same sha256."""
    path = prompts_path(contract)
    if not path.is_file() and fallback is not None and fallback.is_file():
        path = fallback
    where = f"prompt set {path} (contract {contract.name}, field prompts.file)"
    return read_pinned_jsonl(
        path,
        contract.prompts.sha256,
        contract.prompts.count,
        Prompt,
        where,
        ContractError,
        noun="prompts",
        changed="the prompts changed; a new prompt set needs a new version and digest",
    )


def select_prompts(prompts: list[Prompt], wanted: list[str] | None, where: str) -> list[Prompt]:
    """The prompts named in `wanted` (all when None), in the set's order; an id the set lacks is an error
    naming the ones it has. A subset is for smoke runs: a promotion needs every prompt of the set."""
    if wanted is None:
        return prompts
    known = [p.id for p in prompts]
    if unknown := [w for w in wanted if w not in known]:
        raise ContractError(
            f"{where}: no prompt {', '.join(map(repr, unknown))} in the set (it has {', '.join(known)})"
        )
    return [p for p in prompts if p.id in wanted]


class _PinnedLine(Protocol):
    """A model of one line of a pinned set: read from JSON, named by its id."""

    @property
    def id(self) -> str: ...

    @classmethod
    def model_validate_json(cls, json_data: str, /) -> Self: ...


_LineT = TypeVar("_LineT", bound=_PinnedLine)


def read_pinned_jsonl(
    path: Path,
    sha256: str,
    count: int,
    model: type[_LineT],
    where: str,
    error: type[Exception],
    *,
    noun: str,
    changed: str,
) -> list[_LineT]:
    """A set of JSON lines a contract pins (gate prompts, quality samples): the file must exist, have the
    pinned sha256 and count, and every line must validate, with unique ids. Each problem is `error`, naming
    `where` (and the line)."""
    if not path.is_file():
        raise error(f"{where} does not exist")
    data = path.read_bytes()
    seen = bytes_sha256(data)
    if seen != sha256:
        raise error(f"{where} has sha256 {seen}, the contract pins {sha256}: {changed}")
    items: list[_LineT] = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(model.model_validate_json(line))
        except ValidationError as e:
            raise error(f"{where}, line {number}:\n{format_errors(e)}") from e
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise error(f"{where}: duplicate {noun.removesuffix('s')} ids {twice}")
    if len(items) != count:
        raise error(f"{where}: {len(items)} {noun}, the contract says {count}")
    return items


def available() -> list[str]:
    """The contracts found by name: those of the first folder (pytest_b70lab.contract.project.bases) that has any."""
    return sorted(p.stem for p in project.find(CONTRACTS).glob("*.toml"))


def to_toml(c: Contract) -> str:
    """The contract as a TOML file that loads back to the same digest (a sweep's variants, a bench's schedules).
    TOML has no null: an absent field is the contract's default, and every default that is None stays out."""
    import tomli_w

    def without_none(data: Any) -> Any:
        if isinstance(data, dict):
            return {k: without_none(v) for k, v in data.items() if v is not None}
        if isinstance(data, list):
            return [without_none(v) for v in data]
        return data

    return f"# {c.description}\n" + tomli_w.dumps(without_none(c.canonical()))
