"""Python requests + urllib3 Retry through idemproxy, driven by
compat_test.go (TestPythonRequests).

It runs the suite's scenarios against the sidecar at sys.argv[1] and prints
one JSON line per scenario: what the library handed the application for each
call ("charge <id>", or "error <code>" when raise_for_status raised).
"""

import json
import re
import sys
import threading

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

BASE = sys.argv[1]


def session():
    # POST is not retried by default: allowed_methods=None retries every
    # method, which is what a client of an idempotent API turns on.
    retry = Retry(
        total=4,
        backoff_factor=0.2,
        status_forcelist=[409, 429, 503],
        allowed_methods=None,
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    s = requests.Session()
    s.mount("http://", HTTPAdapter(max_retries=retry))
    return s


def charge(key, amount=100, timeout=10):
    try:
        resp = session().post(
            BASE + "/v1/charges",
            data={"amount": amount, "currency": "usd"},
            headers={"Idempotency-Key": key, "X-Forwarded-User": "merchant-1"},
            timeout=(2, timeout),
        )
        resp.raise_for_status()
        return "charge " + resp.json()["id"]
    except requests.HTTPError as err:
        body = err.response.json()
        code = re.split("[/:]", body.get("type", ""))[-1] or body.get("error", {}).get("code", "")
        return "error " + code
    except requests.RequestException as err:
        return "error " + type(err).__name__


def report(scenario, *calls):
    print(json.dumps({"scenario": scenario, "calls": list(calls)}), flush=True)


report("plain", charge("plain-1"))
report("replay", charge("plain-1"))
report("reused", charge("plain-1", 999))
report("malformed", charge('"unterminated'))
report("reset", charge("reset-1"))
first = charge("busy-1")
report("busy", first, *([charge("busy-1")] if first.startswith("error") else []))
results = [None, None]


def concurrent(i):
    results[i] = charge("slow-1")


threads = [threading.Thread(target=concurrent, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
report("concurrent", *results)
report("timeout", charge("timeout-1", timeout=0.3))
