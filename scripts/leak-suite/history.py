# Request handler with a class-level history: every Handler instance appends its request body
# to Handler.history, which all instances share and nobody trims. leak: history is a list;
# bounded: history is a deque(maxlen=32).
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


def read_body(request_id):
    head = b'{"request": %d, "items": [' % request_id
    return head + FIELD * (96 * 1024 // len(FIELD)) + b"]}"  # LEAK-SITE


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode == "bounded":
        Handler.history = collections.deque(maxlen=32)
    elif mode != "leak":
        sys.exit(f"usage: {sys.argv[0]} leak|bounded")
    items = 0
    for request_id in range(100):
        items += Handler(read_body(request_id)).handle()
        time.sleep(0.02)
    print(f"{items} items, {len(Handler.history)} bodies in history")


if __name__ == "__main__":
    main()
