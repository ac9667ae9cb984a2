"""The files of a fine-tuning run: the resumable state, the exported model, the sample grids and the curves.

A mixin of AlignTrainer (trainer.py), which holds the attributes these methods read: the model and its reference,
the optimiser or DeepSpeed engine, the config, the counters and histories, the KL controller and the RNG state.
    run.json                which run this is: the base checkpoint (path, sha256), reward, method, epochs done
    align_state.pt          everything needed to resume (trainable weights, optimiser, RNG, stat tracker, history)
    align_state-epochNNNNNN.N.deepspeed/   with DeepSpeed: its engine files, named by align_state.pt
    reward_curve.png, eval_curve.png   the curves (plots.py)
    samples_before.png, samples_after.png   one image per evaluation prompt, same seed
    dalle_aligned.pt        the fine-tuned model in the standard checkpoint format (generate.py loads it)
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from dalle_lab.align.config import AlignConfig, from_dict, to_dict
from dalle_lab.align.lora import lora_state_dict, merged_copy
from dalle_lab.align.plots import plot_eval_curves, plot_reward_curves
from dalle_lab.image_grid import save_grid
from dalle_lab.training.checkpoint import (capture_rng, make_checkpoint, model_state_without_vae, restore_rng,
                                           save_checkpoint)
from dalle_lab.training.deepspeed_files import ENGINE_DIR_SUFFIX, remove_engine_dirs
from dalle_lab.utils import atomic_torch_save, atomic_write, file_sha256, open_wandb

STATE_FILE = "align_state.pt"
STATE_FORMAT = "dalle_lab.align_state/1"
RUN_FILE = "run.json"


def base_identity(path) -> dict:
    """The checkpoint a run fine-tunes, as run.json and the state file record it."""
    return {"path": str(path), "sha256": file_sha256(path)}


def read_run_file(out_dir) -> dict:
    """What run.json says about the run in out_dir ({} when there is none: a run from before run.json)."""
    path = Path(out_dir) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _describe(base: dict | None, reward: str) -> str:
    where = f"{base['path']} (sha256 {base['sha256'][:12]})" if base else "a model given in code"
    return f"{where} on {reward}"


def resume_line(out_dir, base: dict | None, config: AlignConfig) -> str:
    """The first line of a resumed run, once its folder is known to hold the same run: the same base checkpoint
    (by sha256, wherever it lies now) and reward. Another one is a ValueError naming both and the two ways out."""
    out_dir = Path(out_dir)
    recorded = read_run_file(out_dir)
    theirs, ours = recorded.get("base"), base
    other_base = bool(theirs and ours and theirs["sha256"] != ours["sha256"])
    other_reward = "reward" in recorded and recorded["reward"] != config.reward
    if other_base or other_reward:
        what = " and ".join(w for w, differs in (("base checkpoint", other_base), ("reward", other_reward)) if differs)
        raise ValueError(f"{out_dir} holds a run with another {what}: {_describe(theirs, recorded['reward'])} there, "
                         f"{_describe(ours, config.reward)} now; give another --output_dir, or --overwrite to start "
                         f"afresh in {out_dir}")
    done = (f"epoch {recorded['epoch']} ({recorded['images_sampled']} images sampled)" if "epoch" in recorded
            else "its last saved epoch")
    return (f"[align] resumed {out_dir / STATE_FILE} at {done}: {_describe(theirs or ours, config.reward)}; "
            f"--overwrite starts afresh")


class RunFiles:
    """save_state / load_state (exact resume), save_grid, plot_curve, merged_model and export."""

    def save_state(self) -> Path | None:
        """Every process calls it (under DeepSpeed each writes its engine shard); process 0 writes the file."""
        # DeepSpeed's own engine files (optimizer partitions): collective, every process writes its own
        engine_dir = engine_record = None
        if self.deepspeed is not None:
            engine_dir = self._new_engine_dir()
            engine_record = self.deepspeed.save_engine_files(engine_dir)
        if not self.processes.is_main:
            return None
        if self.lora_modules:
            weights = lora_state_dict(self.dalle)
        else:
            weights = {name: p.detach().clone() for name, p in self._transformer_parameters()}
        state = {
            "format": STATE_FORMAT,
            "config": to_dict(self.config),
            "weights": weights,
            "optimizer": None if self.deepspeed is not None else self.optimizer.state_dict(),
            "epoch": self.epoch,
            "images_sampled": self.images_sampled,
            "elapsed_s": self.elapsed_s,
            "cpu_s": self.cpu_s,
            "history": self.history,
            "eval_history": self.eval_history,
            "kl_controller": self.kl.state_dict(),
            "rng": capture_rng(),
            "generator": self.generator.get_state(),
            "extra": self.extra_state_dict(),
            "step_size": self.step_size,  # samples per optimizer step, all processes together
            "prompts": list(self.prompts),  # the RL prompt pool (after screening)
            "screened": self.screened,
        }
        if engine_dir is not None:
            state["deepspeed"] = engine_record
        if self.base is not None:
            state["base"] = self.base
        path = atomic_torch_save(state, self.out_dir / STATE_FILE)
        self.write_run_file()
        if engine_dir is not None:  # the state file now names the new directory: the older ones can go
            remove_engine_dirs(self.out_dir, f"{Path(STATE_FILE).stem}-epoch", keep={engine_dir.name})
        return path

    def start_wandb(self, settings: dict | None, resumed: bool):
        """The wandb run each epoch is logged to when `settings` name one ({"name", "entity", "project"}); a resumed
        run continues its wandb run (the id is in run.json). None without settings: wandb is never imported."""
        if not settings or not settings.get("name"):
            return None
        run_id = read_run_file(self.out_dir).get("wandb_run_id") if resumed else None
        return open_wandb(settings["name"], settings.get("entity"), settings.get("project") or "dalle_lab", run_id,
                          config={**to_dict(self.config), "base": self.base})

    def write_run_file(self) -> None:
        """run.json: which run the folder holds (read before resuming it) and how far it got (process 0)."""
        record = {"base": self.base, "reward": self.config.reward, "method": self.config.method,
                  "epoch": self.epoch, "images_sampled": self.images_sampled,
                  "wandb_run_id": getattr(getattr(self, "wandb_run", None), "id", None)}
        atomic_write(self.out_dir / RUN_FILE,
                     lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8"))

    def _new_engine_dir(self) -> Path:
        """A directory name no earlier save used (the state file may be saved twice in one epoch, and the current
        state file names the older directory until the new state replaces it)."""
        for n in itertools.count():
            path = self.out_dir / f"{Path(STATE_FILE).stem}-epoch{self.epoch:06d}.{n}{ENGINE_DIR_SUFFIX}"
            if not path.exists():
                return path

    def load_state(self, path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"{path} is not an alignment state file; remove it or choose another --output_dir")
        saved = from_dict(state["config"])
        if state.get("step_size", self.step_size) != self.step_size:
            raise ValueError(f"{path} was written by a run with {state['step_size']} samples per optimizer step "
                             f"(train_batch_size x processes x gradient_accumulation_steps), this run has "
                             f"{self.step_size}; resume with the same product, or use another --output_dir")
        theirs = state.get("base")
        if theirs and self.base and theirs["sha256"] != self.base["sha256"]:
            raise ValueError(f"{path} fine-tunes {_describe(theirs, saved.reward)}, not {self.base['path']} (sha256 "
                             f"{self.base['sha256'][:12]}); give another --output_dir, or --overwrite to start afresh")
        for name in ("method", "reward", "lora_rank"):
            if getattr(saved, name) != getattr(self.config, name):
                raise ValueError(f"{path} was written by a run with {name}={getattr(saved, name)!r}, this run has "
                                 f"{getattr(self.config, name)!r}; use the same settings to resume, or another "
                                 f"--output_dir, or --overwrite, to start afresh")
        params = dict(self.dalle.named_parameters())
        missing = [name for name in state["weights"] if name not in params]
        if missing:
            raise ValueError(f"{path} holds weights this model lacks ({missing[:3]}); was it another model?")
        with torch.no_grad():
            for name, value in state["weights"].items():
                params[name].copy_(value)
        if self.deepspeed is not None:
            self.deepspeed.load_training_state(state, path)
        elif state["optimizer"] is None:
            raise ValueError(f"{path} was written by a DeepSpeed run: resume it with the same deepspeed_zero_stage")
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.images_sampled = state["epoch"], state["images_sampled"]
        self.elapsed_s, self.history = state["elapsed_s"], list(state["history"])
        self.eval_history = list(state.get("eval_history", []))
        self.cpu_s = float(state.get("cpu_s", 0.0))
        if "kl_controller" in state:
            self.kl.load_state_dict(state["kl_controller"])
        restore_rng(state["rng"])
        self.generator.set_state(state["generator"])
        self.load_extra_state(state["extra"])
        if "prompts" in state:
            self.prompts, self.screened = list(state["prompts"]), bool(state["screened"])

    @torch.no_grad()
    def save_grid(self, path, seed: int = 1234) -> Path:
        """One image per evaluation prompt from a fixed seed (the global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            images = []
            size = self.config.sample_batch_size
            for start in range(0, len(self.eval_prompts), size):
                images.append(self.sample(self.tokenize(self.eval_prompts[start:start + size]))[0].cpu())
        return save_grid(torch.cat(images), path, captions=self.eval_prompts, scale=4, nrow=4)

    def plot_curve(self) -> Path:
        path = plot_reward_curves({self.config.method: self.history}, self.out_dir / "reward_curve.png",
                                  title=f"{self.config.reward} ({self.config.method})")
        if self.eval_history:
            plot_eval_curves(self.eval_history, self.out_dir / "eval_curve.png", title=self.config.reward)
        return path

    def merged_model(self):
        """The fine-tuned transformer with LoRA adapters folded into the base weights (a copy when LoRA is used)."""
        if not self.lora_modules:
            return self.dalle
        return merged_copy(self.dalle)

    def export(self, path) -> Path:
        """Write the fine-tuned model in the standard checkpoint format, so generate.py and load_dalle read it."""
        model = self.merged_model()
        checkpoint = make_checkpoint(
            config=self.dalle.config.to_dict(), tokenizer_identity=self.tokenizer.identity,
            vae_identity=self.dalle.vae.identity, model=model_state_without_vae(model),
            align={"config": to_dict(self.config), "epochs": self.epoch, "images_sampled": self.images_sampled},
        )
        return save_checkpoint(checkpoint, path)
