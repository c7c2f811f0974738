# Handler.history, a class-level list shared by all instances, keeps every ~96 KiB request body. Variants: leak | bounded (history is a deque(maxlen=16)).
import collections
import sys
import time

FIELD = b'{"sku": 123456, "qty": 2, "note": "gift wrap please"},'


class Handler:
    history = []

    def __init__(self, body):
        self.body = body

    def handle(self):
        self.history.append(self.body)  # kept "for debugging"
        return self.body.count(b"sku")

    @classmethod
    def debug_dump(cls):
        return f"{len(cls.history)} bodies, {sum(map(len, cls.history))} bytes"


def read_body(request_id):
    head = b'{"request": %d, "items": [' % request_id
    return head + FIELD * (96 * 1024 // len(FIELD)) + b"]}"  # LEAK-SITE


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode == "bounded":
        Handler.history = collections.deque(maxlen=16)
    elif mode != "leak":
        sys.exit(f"usage: {sys.argv[0]} leak|bounded")
    items = 0
    for request_id in range(100):
        items += Handler(read_body(request_id)).handle()
        time.sleep(0.02)
    print(f"{items} items; history: {Handler.debug_dump()}")


if __name__ == "__main__":
    main()
