"""Draft capture for the DFlash parity test, loaded by vLLM in every process (`vllm.general_plugins`).

Off unless `B70LAB_CAPTURE_DRAFT=<folder>` is set. Then it wraps four methods of vLLM's
`DFlashLagunaForCausalLM` and saves, per drafting step, what the real draft received and produced:

    aux_hidden         [num_ctx, n_aux * H]  the target's raw aux hidden states (`combine_hidden_states` input)
    context_states     [num_ctx, H]          their `combine_hidden_states` output (the draft's context)
    context_positions  [num_ctx]             positions `precompute_and_store_context_kv` writes them at
    input_ids          [num_query]           the query block: bonus token, then mask tokens
    positions          [num_query]           the block's positions
    hidden             [num_query, H]        the draft's final (normed) hidden states
    logits             [num_sampled, V]      `compute_logits` on the sampled rows (the mask positions)

as `<folder>/step-<pid>-<n>.pt` (torch.save, CPU tensors). The calls come in this order in
`SpecDecodeBaseProposer.propose`: combine -> precompute (with a slot mapping; dummy runs pass none and
are not recorded) -> forward -> compute_logits. It changes nothing the engine computes.

Imports nothing else of the package: it runs inside vLLM's processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

ENV_CAPTURE = "B70LAB_CAPTURE_DRAFT"
log = logging.getLogger("vllm.b70lab_draft_capture")
_registered = False


class _Recorder:
    """One open drafting step at a time; written out when its logits arrive."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0
        self.pending_aux: Any = None
        self.pending_states: Any = None
        self.step: dict[str, Any] | None = None

    @staticmethod
    def _keep(tensor) -> Any:
        return tensor.detach().to("cpu").clone()

    def combined(self, aux, states) -> None:
        self.pending_aux, self.pending_states = self._keep(aux), self._keep(states)

    def context(self, positions, slot_mapping) -> None:
        if slot_mapping is None or self.pending_aux is None:  # dummy run: computed, not stored
            self.step = None
            return
        self.step = {
            "aux_hidden": self.pending_aux,
            "context_states": self.pending_states,
            "context_positions": self._keep(positions),
        }
        self.pending_aux = self.pending_states = None

    def query(self, input_ids, positions, hidden) -> None:
        if self.step is not None and "input_ids" not in self.step:
            self.step.update(
                input_ids=self._keep(input_ids), positions=self._keep(positions), hidden=self._keep(hidden)
            )

    def logits(self, logits) -> None:
        step, self.step = self.step, None
        if step is None or "input_ids" not in step or logits is None:
            return
        import torch

        step["logits"] = self._keep(logits)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step-{os.getpid()}-{self.count:05d}.pt"
        torch.save(step, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)  # a reader never sees half a step
        self.count += 1


def install(folder: Path) -> bool:
    """Wrap DFlashLagunaForCausalLM's methods to record into `folder`; False if this vLLM has no such model."""
    try:
        from vllm.model_executor.models.laguna_dflash import DFlashLagunaForCausalLM as cls
    except ImportError as e:
        log.warning("b70lab draft capture not installed (pid %d): %s", os.getpid(), e)
        return False
    recorder = _Recorder(folder)
    combine, precompute, forward, compute_logits = (
        cls.combine_hidden_states,
        cls.precompute_and_store_context_kv,
        cls.forward,
        cls.compute_logits,
    )

    def combine_hidden_states(self, hidden_states):
        out = combine(self, hidden_states)
        recorder.combined(hidden_states, out)
        return out

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
        recorder.context(context_positions, context_slot_mapping)
        return precompute(self, context_states, context_positions, context_slot_mapping)

    def forward_(self, input_ids, positions, inputs_embeds=None):
        out = forward(self, input_ids, positions, inputs_embeds)
        recorder.query(input_ids, positions, out)  # padded rows too, where a CUDA graph pads the batch
        return out

    def compute_logits_(self, hidden_states):
        out = compute_logits(self, hidden_states)
        recorder.logits(out)
        return out

    cls.combine_hidden_states = combine_hidden_states
    cls.precompute_and_store_context_kv = precompute_and_store_context_kv
    cls.forward = forward_
    cls.compute_logits = compute_logits_
    return True


def register() -> None:
    global _registered
    folder = os.environ.get(ENV_CAPTURE)
    if _registered or not folder:
        return
    _registered = True
    if install(Path(folder)):
        log.info("b70lab draft capture installed (pid %d): %s", os.getpid(), folder)
