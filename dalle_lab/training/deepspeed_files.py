"""DeepSpeed's own engine state on disk, written and read per rank.

A DeepSpeed checkpoint is two things side by side: the dalle_lab checkpoint file (float32 weights, settings, data
position; what generate.py reads) and a directory of DeepSpeed's engine files, which the file names in
ckpt["deepspeed"]["dir"] (relative to its own folder):

    dalle-step00000040.pt
    dalle-step00000040.deepspeed/
        dalle_lab/mp_rank_00_model_states.pt      the module as DeepSpeed holds it, and at ZeRO 0 the optimizer;
                                                  written by rank 0 (ZeRO-3: one such file per rank)
        dalle_lab/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt
                                                  rank R's partition (ZeRO 1-3): its float32 master weights and
                                                  Adam moments; written by rank R alone
        zero_to_fp32.py                           DeepSpeed's consolidation script (not needed to resume)

Each rank writes only its own files and no rank ever holds another's optimizer partition. On resume DeepSpeed
(`load_checkpoint`, ZeRO's default non-elastic checkpoints) reads each rank's own partition plus the module file
every rank needs anyway below ZeRO-3.

Durability: every file DeepSpeed writes goes through `DurableWrites` (temporary name, fsync, rename, fsync of its
folder). The directory is written under a temporary name; once every rank has reported its files (the gather is
the barrier), rank 0 renames it into place and fsyncs the folder. Only then is the .pt written, the latest link
moved and older checkpoints deleted (loop.py, checkpoint.py), so a crash at any moment leaves the previous
checkpoint whole. ckpt["deepspeed"]["files"] lists each rank's files and sizes: a resume checks them first and
names a missing or cut file in one line instead of DeepSpeed's traceback.

Old checkpoints (before the per-rank layout) carry the engine files packed as bytes inside the .pt
(ckpt["deepspeed"]["files"] a dict of name -> bytes); `engine_files_dir` unpacks them to a private temporary
directory, so they still resume.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import CheckpointError
from .distributed import DistInfo, barrier, broadcast_object, gather_objects

DS_TAG = "dalle_lab"  # DeepSpeed's tag: the sub-directory its files go in
LAYOUT = "per_rank_dir"
ENGINE_DIR_SUFFIX = ".deepspeed"


class DurableWrites:
    """Stands in for DeepSpeed's checkpoint engine while it saves: each file is written by the real engine under
    a temporary name, fsynced and renamed into place (dalle_lab.utils.atomic_write), and its path and size
    recorded. Everything else (load, makedirs, create, commit) is the real engine's."""

    def __init__(self, inner, root: Path):
        self.inner, self.root = inner, Path(root)
        self.written: list[tuple[str, int]] = []  # (path relative to root, bytes), in the order written

    def save(self, state_dict, path: str) -> None:
        from dalle_lab.utils import atomic_write

        atomic_write(path, lambda tmp: self.inner.save(state_dict, tmp))
        self.written.append((str(Path(path).relative_to(self.root)), os.path.getsize(path)))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def check_checkpoint_engine(engine) -> None:
    """A decoupled (asynchronous) DeepSpeed checkpoint writer would return before the files exist, so the
    checkpoint could name files that are not there yet."""
    if engine.checkpoint_engine.is_decoupled():
        raise ValueError("the --deepspeed_config asks for a decoupled (asynchronous) checkpoint writer; dalle_lab "
                         "needs every engine file on disk before its checkpoint names them: remove the "
                         "\"checkpoint\" writer setting from the config")


def engine_dir_of(checkpoint_path: str | os.PathLike) -> Path:
    """Where the engine files of the checkpoint at `checkpoint_path` go: beside it, <stem>.deepspeed."""
    path = Path(checkpoint_path)
    return path.with_name(path.stem + ENGINE_DIR_SUFFIX)


def write_engine_files(engine, dist: DistInfo, final_dir: Path, zero_stage: int) -> dict:
    """Collective: every rank writes its own DeepSpeed files, durably; the directory appears at `final_dir`
    complete or not at all. Returns what the checkpoint records about them (on every rank)."""
    from dalle_lab.utils import fsync_path

    final_dir = Path(final_dir)
    tmp = None
    if dist.is_main:
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{final_dir.name}.", suffix=".tmp", dir=final_dir.parent)
    tmp = Path(broadcast_object(tmp))  # one directory on the shared file system
    writes = DurableWrites(engine.checkpoint_engine, tmp)
    engine.checkpoint_engine = writes
    try:
        engine.save_checkpoint(str(tmp), tag=DS_TAG, client_state={}, save_latest=False)
    finally:
        engine.checkpoint_engine = writes.inner
    files = gather_objects(writes.written)  # every rank's files are durable once it is here
    if dist.is_main:
        fsync_path(tmp / DS_TAG)  # the entries of the directories DeepSpeed made
        fsync_path(tmp)
        if final_dir.exists():  # left by a save of this step that was interrupted before its .pt was written
            shutil.rmtree(final_dir)
        os.replace(tmp, final_dir)
        fsync_path(final_dir.parent)
    barrier()
    return {"layout": LAYOUT, "dir": final_dir.name, "tag": DS_TAG, "world_size": dist.world_size,
            "zero_stage": zero_stage, "files": [[[name, size] for name, size in rank] for rank in files]}


def check_layout(meta: dict, dist: DistInfo, zero_stage: int, path) -> None:
    """Refuse, in one line, engine state written by another number of processes or another ZeRO stage."""
    if meta["world_size"] != dist.world_size or meta["zero_stage"] != zero_stage:
        raise CheckpointError(
            f"{path} was written by {meta['world_size']} process(es) at ZeRO stage {meta['zero_stage']}; this run "
            f"has {dist.world_size} at stage {zero_stage}: resume with the same number of processes and "
            f"--zero_stage, or start a new run from its weights with --dalle_path")


@contextlib.contextmanager
def engine_files_dir(meta: dict, checkpoint_path, rank: int):
    """The directory to hand DeepSpeed's load_checkpoint: the per-rank directory beside the checkpoint, its
    files checked first; or, for an old checkpoint with the files packed inside, a private unpacked copy."""
    if "dir" not in meta:  # the layout before per-rank directories
        workdir = tempfile.mkdtemp(prefix=f".deepspeed-load-rank{rank}-")
        try:
            for name, data in meta["files"].items():
                target = Path(workdir) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.numpy().tobytes())
            yield Path(workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    directory = Path(checkpoint_path).parent / meta["dir"]
    for writer, files in enumerate(meta["files"]):
        for name, size in files:
            file = directory / name
            found = file.stat().st_size if file.is_file() else None
            if found != size:
                state = "is missing" if found is None else f"has {found} bytes, not the {size} written"
                raise CheckpointError(
                    f"{checkpoint_path}: DeepSpeed file {file} (rank {writer}'s part) {state}; the {meta['dir']} "
                    f"directory must stay beside {Path(checkpoint_path).name} (copy both), or start a new run "
                    f"from its weights with --dalle_path")
    yield directory


def remove_engine_dirs(directory: str | os.PathLike, stem_prefix: str, keep: set[str]) -> list[Path]:
    """Delete the engine-file directories <stem_prefix>*.deepspeed in `directory` whose names are not in `keep`,
    and temporary ones an interrupted save left. Call it only after the newest checkpoint is durable."""
    directory = Path(directory)
    doomed = [p for p in directory.glob(f"{stem_prefix}*{ENGINE_DIR_SUFFIX}") if p.is_dir() and p.name not in keep]
    doomed += [p for p in directory.glob(f".{stem_prefix}*{ENGINE_DIR_SUFFIX}.*.tmp") if p.is_dir()]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
