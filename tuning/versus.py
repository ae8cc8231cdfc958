"""st1 against the candidates without credits (gp3, instance store) on the advice's plan: when st1 still wins and when
it does not, one line each, from the simulated candidates and the volume model. Pure.

The advice makes one decision, here (`choose`: the cheapest EBS candidate within the slack of the fastest); the
verdict only says it again for st1: st1 wins exactly when it is the volume chosen, and when it is not the reason is
the rule's (it does not fit the day or is slower, each for its credits when they run out, or it is as fast and
dearer than the choice).

st1 wins on large sequential I/O within its credits, being the cheapest per GiB; it loses when its credits run out
(the plan's bytes per day exceed what its bucket earns), on small random I/O (each random request under 1 MiB costs
a whole MiB of credits and throughput: tuning.ebs [HDD]), and when many children share its one baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

from tuning.ebs import GIB, KIB, MIB, Volume
from tuning.instancestore import ASSUMPTION, InstanceStore
from tuning.plan import Plan, Workload


class CandidateResult(Protocol):
    """What is read of tuning.advise.CandidateResult (advise imports this module, so not the class itself)."""

    @property
    def volume(self) -> Volume: ...
    @property
    def download_s(self) -> float: ...
    @property
    def steady_download_s(self) -> float: ...
    @property
    def steady_round_s(self) -> float: ...
    @property
    def credits_run_out_h(self) -> float | None: ...
    @property
    def fits_day(self) -> bool: ...
    @property
    def monthly_usd(self) -> float | None: ...

SECONDS_PER_DAY = 86_400
# The request size a what-if of random I/O uses when the workload's own is 1 MiB or more.
WHAT_IF_RANDOM_KIB = 64


Result = TypeVar("Result", bound=CandidateResult)


def pool(results: Sequence[Result]) -> list[Result]:
    """The candidates the advice chooses among: EBS volumes that fit the day (all EBS volumes when none does).
    Instance store is compared, never chosen: its price is in the instance's, and choosing it changes the types."""
    ebs = [r for r in results if not isinstance(r.volume, InstanceStore)]
    return [r for r in ebs if r.fits_day] or ebs


def choose(candidates: Sequence[Result], slack: float) -> Result | None:
    """The advice's one decision: among `candidates`, the cheapest whose steady round is within `slack` of the
    fastest's (the faster of two as cheap; an unpriced one as free); None when there are none."""
    if not candidates:
        return None
    fastest = min(r.steady_round_s for r in candidates)
    return min((r for r in candidates if r.steady_round_s <= fastest * slack),
               key=lambda r: (r.monthly_usd or 0.0, r.steady_round_s))


def compare(results: Sequence[CandidateResult], workload: Workload, plan: Plan, slack: float,
            chosen: CandidateResult) -> list[str]:
    """The lines (empty when there is no st1 or no candidate without credits to compare it with); `chosen` is the
    advice's decision (`choose` over `pool`), which the verdict says again for st1."""
    st1s = [r for r in results if r.volume.kind == "st1"]
    st1 = chosen if chosen in st1s else choose(st1s, slack)
    others = [r for r in results if not r.volume.is_hdd and not r.volume.bursts]
    if st1 is None or not others:
        return []
    alt = min(others, key=lambda r: (r.steady_round_s, r.monthly_usd is None, r.monthly_usd or 0.0))
    lines = [_verdict(st1, alt, chosen, pool(results), slack), _credits(st1, alt, workload, plan),
             _random(st1, alt, workload), _children(st1, alt, plan)]
    stores = [r for r in results if isinstance(r.volume, InstanceStore)]
    round_bytes = plan.jobs_per_instance * sum(s.write_bytes for s in workload.stages)
    lines.extend(_store(r, st1, round_bytes) for r in stores)
    if stores:
        lines.append(f"Assumption: {ASSUMPTION}.")
    return lines


def _per_gib(r: CandidateResult) -> str:
    if r.monthly_usd is None:
        return "not priced"
    return f"{r.monthly_usd / max(r.volume.size_gib, 1):.3f} USD per GiB-month"


def _cost(r: CandidateResult) -> str:
    return "not priced" if r.monthly_usd is None else f"{r.monthly_usd:,.2f} USD/month ({_per_gib(r)})"


def _verdict(st1: CandidateResult, alt: CandidateResult, chosen: CandidateResult, among: list[CandidateResult],
             slack: float) -> str:
    """st1 against the decision: it wins exactly when it is the volume chosen; else the rule's reason it is not."""
    v, a = st1.volume, alt.volume
    rounds = (f"a steady round takes {st1.steady_round_s:,.1f} s on {v.label} vs {alt.steady_round_s:,.1f} s on "
              f"{a.label}")
    credits = ("its credits last the day" if st1.credits_run_out_h is None else
               f"its credits run out {st1.credits_run_out_h:.1f} h into the day")
    if st1 is chosen:
        return (f"st1 wins on this plan: it is the recommendation, the cheapest within {slack:.2f}x of the fastest "
                f"steady round ({rounds}; {credits}); it costs {_cost(st1)} against {_cost(alt)}.")
    fastest = min(r.steady_round_s for r in among)
    if st1 in among and st1.steady_round_s <= fastest * slack:
        price = "" if chosen.monthly_usd is None else f" ({chosen.monthly_usd:,.2f} USD/month)"
        why = f"it is as fast, but {chosen.volume.label}, the recommendation, costs less{price}"
    elif st1.credits_run_out_h is not None:
        why = "its credits run out"
    elif st1 not in among:
        why = "it does not fit the day"
    else:
        why = f"it is slower: its steady round is over {slack:.2f}x the fastest's {fastest:,.1f} s"
    return f"st1 does not win on this plan ({why}): {rounds}; {credits}; it costs {_cost(st1)} against {_cost(alt)}."


def _job_credits_mib(st1: CandidateResult, workload: Workload) -> float:
    """The st1 credits (MiB, AWS's HDD accounting) one job spends: its bytes to and from the volume."""
    v = st1.volume
    return sum((s.write_bytes + s.read_bytes) * v.cost_per_byte(s.io_size, random_share=s.random_share)
               for s in workload.stages)


def _credits(st1: CandidateResult, alt: CandidateResult, workload: Workload, plan: Plan) -> str:
    v = st1.volume
    per_job = _job_credits_mib(st1, workload)
    earned = v.earn_rate() * SECONDS_PER_DAY  # MiB a day
    within = math.inf if per_job <= 0 else math.floor(earned / per_job)
    count = "any number of" if math.isinf(within) else f"{within:,}"
    head = (f"Credits: {v.label} earns {earned / 1024:,.0f} GiB of credits a day and a job spends "
            f"{per_job / 1024:,.2f} GiB of them, so up to {count} jobs per instance a day "
            f"stay within credits (after the first full bucket); the plan runs {plan.jobs_per_day:,}")
    if st1.credits_run_out_h is None:
        return head + ": they last."
    return head + (f": they run out {st1.credits_run_out_h:.1f} h into the day, then a download takes "
                   f"{st1.steady_download_s:,.1f} s instead of {st1.download_s:,.1f} s ({alt.volume.label}: "
                   f"{alt.steady_download_s:,.1f} s, no credits).")


def _random(st1: CandidateResult, alt: CandidateResult, workload: Workload) -> str:
    v = st1.volume
    stage = max(workload.stages, key=lambda s: s.write_bytes + s.read_bytes)
    base = v.throughput_bps(io_size=stage.io_size, bursting=False) / MIB
    measured = stage.random_share > 0 and stage.io_size < MIB
    io = stage.io_size if stage.io_size < MIB else WHAT_IF_RANDOM_KIB * KIB
    share = stage.random_share if measured else 1.0
    eff = v.throughput_bps(io_size=io, bursting=False, random_share=share) / MIB
    alt_eff = alt.volume.throughput_bps(io_size=io, bursting=False, random_share=share) / MIB
    what = (f"{stage.name} moves {share:.0%} of its bytes in random {io / KIB:,.0f} KiB requests" if measured else
            f"none measured ({stage.name} taken as sequential); were its requests random at {io / KIB:,.0f} KiB")
    return (f"Small random I/O: {what}, each charged as 1 MiB: st1's baseline serves {eff:,.1f} MiB/s of data "
            f"instead of {base:,.1f} sequential ({alt.volume.label}: {alt_eff:,.1f} MiB/s).")


def _children(st1: CandidateResult, alt: CandidateResult, plan: Plan) -> str:
    v, n = st1.volume, plan.jobs_per_instance
    a = alt.volume
    return (f"Many children on one volume: {n} children share {v.label}'s {v.baseline_mibps:,.1f} MiB/s baseline and "
            f"{v.burst_mibps:,.1f} MiB/s burst: {v.baseline_mibps / n:,.2f} and {v.burst_mibps / n:,.2f} MiB/s each "
            f"(figures of the whole volume, shared); {a.label}: {a.baseline_mibps / n:,.2f} MiB/s each, no credits.")


def _store(r: CandidateResult, st1: CandidateResult, round_bytes: int) -> str:
    v = r.volume
    assert isinstance(v, InstanceStore)
    fits = round_bytes <= v.size_gib * GIB
    room = ("holds" if fits else "is too small for") + f" a round's {round_bytes / GIB:,.1f} GiB"
    price = (f"{r.monthly_usd:,.2f} USD/month over the instance without it" if r.monthly_usd is not None else
             f"not priced (in the instance's price: give nvme:{v.instance_type}:usd_per_hour=X, what it adds per "
             "hour)")
    return (f"Instance store {v.instance_type}: {v.size_gib:,} GiB ({room}), at least {v.baseline_mibps:,.0f} MiB/s "
            f"for the whole instance, no credits: a steady round takes {r.steady_round_s:,.1f} s (st1: "
            f"{st1.steady_round_s:,.1f} s); {price}; erased with the instance, which suits scratch; to deploy it: "
            f"-c scratch=instance-store -c instanceTypes={v.instance_type} (compared, not recommended: its price is "
            "the instance's).")

