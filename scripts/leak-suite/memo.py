# Report renderer memoised with functools.lru_cache(maxsize=None): each request asks for a unique
# (customer, request id) pair, so every ~96 KiB report stays cached. leak: unbounded cache;
# bounded: lru_cache(maxsize=32).
import functools
import sys
import time

ROW = b"2024-05-01,widget,  3,  19.99,EUR,shipped,warehouse-7,priority=normal          \n"


def render_report(customer, request_id):
    header = f"report customer={customer} request={request_id}\n".encode()
    rows = 96 * 1024 // len(ROW)
    return header + ROW * rows  # LEAK-SITE


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode not in ("leak", "bounded"):
        sys.exit(f"usage: {sys.argv[0]} leak|bounded")
    cache = functools.lru_cache(maxsize=None if mode == "leak" else 32)
    report = cache(render_report)
    served = 0
    for request_id in range(100):
        served += len(report(request_id % 7, request_id))
        served += len(report(request_id % 7, request_id))  # the page asks twice
        time.sleep(0.02)
    print(f"served {served} bytes, cache {report.cache_info()}")


if __name__ == "__main__":
    main()
