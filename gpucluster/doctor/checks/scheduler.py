"""Where Slurm runs on the nodes (provision --with slurm): is each node usable in it."""

from __future__ import annotations

from gpucluster.doctor.model import CheckResult, Context, Status, check
from gpucluster.slurm_states import NOT_SET_UP, is_healthy, parse_sinfo, problem_of

RESUME = ("once its cause is fixed: sudo scontrol update nodename={name} state=resume "
          "(on a node of the cluster)")
RESTART = ("gpucluster provision --with slurm restarts its slurmd (a node down for long "
           "also needs state=resume: sudo scontrol update nodename={name} state=resume)")


@check("slurm", "scheduler", "where Slurm is set up: each node usable in sinfo (not down, "
       "drained or invalid)", sections=("slurm",))
def slurm(context: Context) -> list[CheckResult]:
    listings = {h.name: (context.facts[h.name].text("slurm") or "").strip()
                for h in context.answering()}
    answered = [text for text in listings.values() if text and text != NOT_SET_UP]
    # Any node's listing will do (they all ask slurmctld), one that parsed first.
    states = next((parsed for text in answered if (parsed := parse_sinfo(text))), {})
    results = []
    for name, text in listings.items():
        if not text or text == NOT_SET_UP:
            results.append(CheckResult("slurm", name, Status.SKIP, "Slurm is not set up here"))
        elif name in states:
            results.append(_judged(name, *states[name]))
        elif not states:  # no node's sinfo answered
            results.append(CheckResult(
                "slurm", name, Status.WARN, f"sinfo failed: {text.splitlines()[-1]}",
                "is slurmctld running? gpucluster provision --with slurm starts it"))
        else:
            results.append(CheckResult(
                "slurm", name, Status.WARN, "Slurm is set up here but sinfo does not list "
                "this node under its inventory name",
                "gpucluster provision --with slurm adds it (a site's own slurm.conf may name "
                "it otherwise)"))
    return results


def _judged(name: str, state: str, reason: str) -> CheckResult:
    if is_healthy(state):
        return CheckResult("slurm", name, Status.OK, f"Slurm has it {state}")
    said = problem_of(state, reason)
    if "drain" in state:  # an admin's (or Slurm's) hold: jobs finish, none start
        return CheckResult("slurm", name, Status.WARN, said, RESUME.format(name=name))
    return CheckResult("slurm", name, Status.FAIL, said, RESTART.format(name=name))
