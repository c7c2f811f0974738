# Event bus: each request subscribes a callback (closing over its ~96 KiB response) to a module-level list. Variants: leak (never unsubscribed) | fixed (unsubscribed when done).
import sys
import time

_listeners = []
stats = {"completed": 0, "bytes": 0}
CHUNK = b"<tr><td>order</td><td>42</td><td>shipped</td></tr>\n"


def subscribe(callback):
    _listeners.append(callback)


def unsubscribe(callback):
    _listeners.remove(callback)


def publish(event):
    for callback in list(_listeners):
        callback(event)


def handle_request(request_id, fixed):
    head = f"HTTP/1.1 200 OK\r\nX-Request-Id: {request_id}\r\n\r\n".encode()
    response = head + CHUNK * (96 * 1024 // len(CHUNK))  # LEAK-SITE

    def on_complete(event):
        if event == request_id:
            stats["completed"] += 1
            stats["bytes"] += len(response)

    subscribe(on_complete)
    publish(request_id)
    if fixed:
        unsubscribe(on_complete)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode not in ("leak", "fixed"):
        sys.exit(f"usage: {sys.argv[0]} leak|fixed")
    for request_id in range(100):
        handle_request(request_id, mode == "fixed")
        time.sleep(0.02)
    print(f"{stats['completed']} requests, {stats['bytes']} bytes, {len(_listeners)} listeners")


if __name__ == "__main__":
    main()
