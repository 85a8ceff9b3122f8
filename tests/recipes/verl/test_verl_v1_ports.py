"""What the V1 backend (`verl.trainer: v1`, issue #50 item 1) took over from the legacy one after its first part:
the planted-collapse control, the gradient split, DAPO's dynamic sampling, PPO with a critic and LoRA. The parts
without Ray first, then each end to end on CPU (slow), with the legacy test it ports named."""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest
import torch

from recipes.config.schema import compose_train_config
from tests.recipes.conftest import MICRO

V1 = [*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=v1"]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")


# -- the planted-collapse control ------------------------------------------------------------------------------------

@pytest.mark.parametrize("strength", [0.25, 1.0])
def test_v1_marks_a_planted_steps_prompts_and_its_sessions_blind_the_shared_rules_rows(strength: float) -> None:
    """`control.blind_from_step` on V1: the manager marks a planted step's training prompts as the legacy
    `_get_gen_batch` does (`blind_marks`), and V1's worker runs a prompt's samples as sessions 0..n-1 of the one
    prompt (no repeated batch, no `priority`), so the agent loop blinds by session: exactly the trajectory rows
    `recipes.runtime.seeds.blinded_rows` picks (the torch and legacy backends' rows), with the step's first seed.
    Earlier steps, validation batches and validation rows are not marked."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import tensordict_utils as tu

    from recipes.runtime.seeds import blinded_rows
    from recipes.verl.agent_loop import _blind_seed
    from recipes.verl.v1 import mark_blinded

    # what the marks rest on, as veRL 0.9.1 has it: every training batch is stamped with its step and dispatched
    # through the manager's public `generate_sequences`; a worker hands each session its prompt's fields
    assert 'tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)' in inspect.getsource(
        PPOTrainer._next_train_batch)
    assert "self.agent_loop_manager.generate_sequences(batch)" in inspect.getsource(PPOTrainer._submit_batch_to_rollout)
    assert "session_id=i, **prompt" in inspect.getsource(AgentLoopWorkerTQ._run_prompt)

    prompts, samples, step = 4, 4, 11
    cfg = compose_train_config([*V1, "seed=2", "control.blind_from_step=3", f"control.blind_strength={strength}",
                                f"trainer.samples_per_prompt={samples}", f"trainer.prompts_per_step={prompts}"])

    def sessions(at: int, split: str = "train", validate: bool = False) -> list:
        batch = tu.get_tensordict({
            "input_ids": torch.zeros(prompts, 2, dtype=torch.long),
            "extra_info": np.array([{"seed": seed, "split": split} for seed in range(21, 21 + prompts)], dtype=object),
            "uid": np.array([f"u{i}" for i in range(prompts)], dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", at)
        if validate:
            tu.assign_non_tensor_data(batch, "validate", True)
        mark_blinded(batch, cfg)
        infos = tu.get(batch, "extra_info")
        return [_blind_seed({"extra_info": infos[prompt], "session_id": session})
                for prompt in range(prompts) for session in range(samples)]

    chosen = blinded_rows(prompts * samples, strength, 2, step)
    assert len(chosen) == round(strength * prompts * samples)
    assert sessions(step) == [21 if row in chosen else None for row in range(prompts * samples)]
    nothing = [None] * (prompts * samples)
    assert sessions(2) == sessions(step, split="val") == sessions(step, validate=True) == nothing


@pytest.mark.slow
@pytest.mark.full  # a warm start and 5 veRL steps: out of CI's tier, as the legacy trainer's control (a bench)
def test_a_planted_collapse_fires_the_collapse_alert_on_v1(session_dir, tmp_path) -> None:
    """The torch backend's planted-collapse control (tests/recipes/diagnostics/test_controls.py, the planted arm,
    its settings and checks) through veRL's V1 trainer: the MI proxies see the input dependence at steps 1-2 and see
    it gone from step 3, entropy does not, and the collapse alert fires within two steps of the plant. On the legacy
    trainer the same run is `benchmarks/bench_controls.py --backend verl` (docs/diagnostics.md: fired at step 4)."""
    from tests.recipes.diagnostics.test_controls import ControlRuns, assert_planted_collapse

    runs = ControlRuns(tmp_path, extra=["backend=verl", "verl.trainer=v1", "trainer.progress=false"],
                       cache=session_dir / "cache", straight=True)
    assert_planted_collapse(runs.arm("planted"))


# -- the gradient split and PPO with a critic -------------------------------------------------------------------------

def test_v1_dynamic_sampling_runs_the_shared_rule_and_clears_the_rest(monkeypatch) -> None:
    """orch's dynamic sampling on V1 (`recipes.verl.v1.dynamic_sampling`) is `recipes.stats.dynamic_sampling.
    gather_groups` on batches of TransferQueue keys (the extra generation batches stubbed): the shared scenario's
    groups, rows and metrics (tests/recipes/stats/test_dynamic_sampling.py, as the torch and legacy backends), the
    batches it needs generated and no more, and every generated row not kept cleared from TransferQueue."""
    from types import SimpleNamespace

    from transfer_queue import KVBatchMeta

    from recipes.verl import v1
    from tests.recipes.stats import test_dynamic_sampling as shared

    def batch(groups: dict[str, list[float]]) -> tuple[KVBatchMeta, list[dict]]:
        keys = [f"{uid}_{session}_0" for uid, returns in groups.items() for session in range(len(returns))]
        rows = [{"orch_trajectory": SimpleNamespace(episode_return=value)}
                for returns in groups.values() for value in returns]
        return KVBatchMeta(partition_id="train", keys=keys, tags=[{} for _ in keys]), rows

    extras = {extra: batch(groups) for extra, groups in enumerate(shared.SCENARIO) if extra}
    generated, cleared = [], []
    monkeypatch.setattr(v1, "extra_batch", lambda trainer, step, extra: generated.append(extra) or extras[extra][0])
    monkeypatch.setattr(v1, "fetch_extra", lambda fresh: fresh)
    monkeypatch.setattr(v1, "extra_fields", lambda fresh: next(rows for meta, rows in extras.values() if meta is fresh))
    monkeypatch.setattr(v1, "place_turn_rewards", lambda fresh, rows: None)
    monkeypatch.setattr(v1.tq, "kv_clear", lambda keys, partition_id: cleared.extend(keys))
    trainer = SimpleNamespace(global_steps=4, step_metrics={shared.GEN_BATCHES: 1.0},
                              cfg=SimpleNamespace(trainer=SimpleNamespace(prompts_per_step=shared.PROMPTS),
                                                  algorithm=SimpleNamespace(max_extra_gen_batches=shared.MAX_EXTRA)))
    first, rows = batch(shared.SCENARIO[0])
    out, out_rows = v1.dynamic_sampling(trainer, first, rows)
    assert generated == [1, 2]  # batch 3 fills the update batch: batch 4 is never generated
    assert list(dict.fromkeys(key.split("_")[0] for key in out.keys)) == shared.UPDATE_GROUPS
    assert [row["orch_trajectory"].episode_return for row in out_rows] == shared.UPDATE_RETURNS
    assert sorted({key.split("_")[0] for key in cleared}) == ["a", "c", "g", "h", "k", "m", "n", "p"]
    assert trainer.step_metrics == shared.METRICS
