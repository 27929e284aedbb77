"""`shardwise validate`: train a TorchRec DLRM sharded by each plan and report samples/s."""

from __future__ import annotations

from pydantic import Field

from shardwise.evaluation import DLRMThroughput
from shardwise.extras import require, require_fbgemm
from shardwise.profiling import DeviceName
from shardwise.workload.documents import refuse_directory, write_json_document

from .base import JobResult, JobSettings, SettingsError
from .evaluate import load_task_and_plans


class ValidateSettings(JobSettings):
    """The plan (and others to time in the same run) and the training run's size."""

    task: str = Field(description="shardwise.task/v1 file")
    plan: str = Field(description="shardwise.plan/v1 file")
    compare: tuple[str, ...] = Field(default=(), description="another plan to time in the same run")
    iters: int = Field(default=20, ge=1, description="timed training iterations")
    warmup: int = Field(default=5, ge=0, description="warm-up iterations (not timed)")
    seed: int = 0
    out: str | None = Field(default=None, description="write the throughput results as JSON here")
    device: DeviceName = Field(default=None, description="cpu, cuda, cuda:N (default: cuda when present)")
    batch_size: int | None = Field(default=None, ge=1,
                                   description="global batch (default: the task's; on CPU at most 4096)")


class ValidateResult(JobResult):
    """Samples/s under each plan, the first against the others."""

    throughputs: list[DLRMThroughput]
    out: str | None = None

    def ratio(self, other: int = 1) -> float:
        """Samples/s of the first plan over those of plan `other` (above 1: the first trains faster)."""
        return self.throughputs[0].samples_per_s / self.throughputs[other].samples_per_s

    def summary(self) -> str:
        """One line per plan, then the ratios."""
        lines = [t.summary() for t in self.throughputs]
        first = self.throughputs[0]
        lines += [f"{first.method} / {t.method} throughput: {self.ratio(i):.3f}x"
                  for i, t in enumerate(self.throughputs) if i]
        if self.out:
            lines.append(f"wrote {self.out}")
        return "\n".join(lines)


def run(settings: ValidateSettings) -> ValidateResult:
    """Train under each plan with the same seeded batches, one process per device (the same processes for all)."""
    # torch and torchrec load only when training: `validate --help` and a command line's mistakes answer without them
    from shardwise.evaluation import measure_dlrm_throughputs

    task, plans = load_task_and_plans(settings.task, (settings.plan, *settings.compare))
    if settings.out:
        refuse_directory(settings.out, SettingsError)  # before the training runs, not after
    # said here, not in each rank's process as a traceback
    require_fbgemm()
    require("torchrec")
    throughputs = measure_dlrm_throughputs(task, plans, iters=settings.iters, warmup=settings.warmup,
                                           batch_size=settings.batch_size, device=settings.device, seed=settings.seed)
    if settings.out:
        write_json_document([t.to_json() for t in throughputs], settings.out)
    return ValidateResult(throughputs=throughputs, out=settings.out)


def versus_baseline(validated: ValidateResult) -> dict[str, float]:
    """DLRM samples/s of the first plan and the second (TorchRec's in the pipeline); ratio > 1: the first wins."""
    first, base = validated.throughputs[:2]
    return {
        "method_samples_per_s": first.samples_per_s,
        "torchrec_samples_per_s": base.samples_per_s,
        "throughput_ratio_to_torchrec": validated.ratio(1),
    }
