# Report renderer memoised with lru_cache(maxsize=None) and called with unique request ids, so every ~96 KiB report stays cached. Variants: leak | bounded (maxsize=16).
import functools
import sys
import time
from urllib.parse import parse_qs

ROW = b"2024-05-01,widget,  3,  19.99,EUR,shipped,warehouse-7,priority=normal          \n"


def render_report(customer, request_id):
    header = f"report customer={customer} request={request_id}\n".encode()
    rows = 96 * 1024 // len(ROW)
    return header + ROW * rows  # LEAK-SITE


class ReportService:
    def __init__(self, maxsize):
        self.report = functools.lru_cache(maxsize=maxsize)(render_report)
        self.served = 0

    def handle(self, query):
        params = parse_qs(query)
        customer = int(params["customer"][0])
        request_id = int(params["request"][0])
        body = self.report(customer, request_id)
        self.served += len(body)
        return 200, body


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode not in ("leak", "bounded"):
        sys.exit(f"usage: {sys.argv[0]} leak|bounded")
    service = ReportService(maxsize=None if mode == "leak" else 16)
    for request_id in range(100):
        query = f"customer={request_id % 7}&request={request_id}"
        service.handle(query)
        service.handle(query)  # the page fetches the report twice
        time.sleep(0.02)
    print(f"served {service.served} bytes, cache {service.report.cache_info()}")


if __name__ == "__main__":
    main()
