"""The user data's qualification step: measure scratch (profiling.qualifyio), write the figures where every child's
profiler reads them, post one event to the pipeline's log group, and, with hostQualification=fence, say whether this
slow host is one the pipeline may fence this hour (tuning/qualify.py owns the policy).

The user data (tuning/hostscript.py) runs it as `hostpy qualify CONF INSTANCE_ID INSTANCE_TYPE`: this file's code,
profiling/qualifyio.py's and tuning/hostpost.py's in one compressed program (tuning/hostprogram.py), so nothing newer
than Python 3.9 and nothing outside the standard library. CONF is the JSON tuning.host renders: target, io, seconds,
max_bytes, small, min_ratio, mode, per_hour, expected (by instance type, '*' for any other), file, volume, pipeline.
IMDS and the log group come as the poster's do (IOBATCH_IMDS, IOBATCH_LOG_GROUP; either empty: no event, no fence);
IOBATCH_QUALIFICATION_FILE, for tests on a machine that is not a Batch host, writes the figures elsewhere.

The fence cap: a slow host first makes its own stream FENCE_PREFIX<UTC hour>/<instance id> in the log group, then
lists that hour's and the previous hour's (one DescribeLogStreams each); it fences when fewer than `per_hour` of those
streams were made in the hour before its own. Every host agrees on that order, so at most `per_hour` hosts fence in
any hour (a host that could not count is not fenced: it runs, flagged). Exit 0 (the line on stdout says how it went),
EXIT_FENCE with the reason on stdout, 1 when nothing could be measured.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from profiling.qualifyio import FENCED, SLOW, SLOW_CAPPED, QualifyError, judge, measure, properties, summary
from tuning.hostpost import call, endpoint, metadata, post_event

FENCE_PREFIX = "host-fence/"
EVENT_PREFIX = "host-qualification/"
EXIT_FENCE = 3
LIST_LIMIT = 50  # DescribeLogStreams' most per page (tuning.qualify.MAX_FENCES_PER_HOUR)


def fence_claim(imds: str, group: str, instance_id: str, per_hour: int, now: float | None = None) -> bool:
    """Whether this host is among the first `per_hour` slow hosts of the hour before it (see the module)."""
    credentials, region, domain = metadata(imds)
    url = endpoint(region, domain)
    now = time.time() if now is None else now
    hours = [time.strftime("%Y-%m-%dT%H", time.gmtime(now - 3600)), time.strftime("%Y-%m-%dT%H", time.gmtime(now))]
    mine = FENCE_PREFIX + hours[1] + "/" + instance_id
    call(url, region, credentials, "CreateLogStream", {"logGroupName": group, "logStreamName": mine})
    streams: list[dict[str, Any]] = []
    for hour in hours:
        found = call(url, region, credentials, "DescribeLogStreams",
                     {"logGroupName": group, "logStreamNamePrefix": FENCE_PREFIX + hour + "/", "limit": LIST_LIMIT})
        if found.get("nextToken"):
            return False  # a page's worth this hour: past any cap
        streams += found.get("logStreams") or []
    own = [s for s in streams if s.get("logStreamName") == mine]
    if not own:
        return False
    key = (int(own[0].get("creationTime") or 0), mine)
    earlier = [s for s in streams if key[0] - 3600_000 < int(s.get("creationTime") or 0)
               and (int(s.get("creationTime") or 0), str(s.get("logStreamName"))) < key]
    return len(earlier) < per_hour


def qualify_main() -> int:
    args = sys.argv[sys.argv.index("qualify") + 1:]
    conf = json.loads(args[0])
    instance_id, instance_type = args[1] or "unknown", args[2] or "unknown"
    env = os.environ
    imds, group, path = env.get("IOBATCH_IMDS", ""), env.get("IOBATCH_LOG_GROUP", ""), env.get(
        "IOBATCH_QUALIFICATION_FILE") or conf["file"]
    table = conf["expected"]
    want = table.get(instance_type) or table["*"]
    try:
        record = measure(conf["target"], conf["io"], conf["seconds"], conf["max_bytes"], conf["small"])
    except (OSError, QualifyError) as exc:
        print(f"qualification of {conf['target']} did not run: {exc}")
        return 1
    judge(record, want[0], want[1], conf["min_ratio"])
    record.update({"pipeline": conf["pipeline"], "volume": conf["volume"], "instance_id": instance_id,
                   "instance_type": instance_type, "policy": conf["mode"],
                   "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if record["verdict"] == SLOW and conf["mode"] == "fence":
        fenced = False
        if imds and group and instance_id != "unknown":
            try:
                fenced = fence_claim(imds, group, instance_id, conf["per_hour"])
            except (OSError, ValueError, KeyError, IndexError) as exc:
                print(f"iobatch-host: the hour's fences could not be counted ({exc}): not fencing", file=sys.stderr)
        record["verdict"] = FENCED if fenced else SLOW_CAPPED
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as out:
        json.dump(record, out)
    os.chmod(path + ".tmp", 0o644)
    os.replace(path + ".tmp", path)
    line = f"{summary(record)} ({conf['volume']}, {instance_type})"
    if imds and group:
        message = dict(Pipeline=conf["pipeline"], InstanceId=instance_id, InstanceType=instance_type,
                       Volume=conf["volume"], **properties(record), Summary=line)
        try:
            post_event(imds, group, EVENT_PREFIX + instance_id, json.dumps(message))
        except (OSError, ValueError, KeyError, IndexError) as exc:
            print(f"iobatch-host: the qualification was not posted ({exc})", file=sys.stderr)
    if record["verdict"] == FENCED:
        print(f"scratch qualified at {record['ratio']:.3f}x, below qualifyMinRatio {conf['min_ratio']}: {line}")
        return EXIT_FENCE
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(qualify_main())
