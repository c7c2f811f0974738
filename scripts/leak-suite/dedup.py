# ETL dedup: the module-level _seen dict (digest -> row) is never reset between batches. Variants: leak | fixed (reset per batch) | spike (fixed + a 40 MiB backfill batch every 25 batches).
import hashlib
import sys
import time

_seen = {}
COLUMNS = b"2024-05-01T12:00:00Z,eu-west-1,checkout,200,0.042,Mozilla/5.0 (X11; Linux x86_64),"


def make_row(batch, i, width):
    return b"%d,%d," % (batch, i) + COLUMNS * (width // len(COLUMNS))  # LEAK-SITE


def load_batch(batch, rows, width):
    new = 0
    for i in range(rows):
        row = make_row(batch, i, width)
        digest = hashlib.blake2b(row[:64], digest_size=16).digest()
        if digest not in _seen:
            _seen[digest] = row
            new += 1
    return new


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode not in ("leak", "fixed", "spike"):
        sys.exit(f"usage: {sys.argv[0]} leak|fixed|spike")
    loaded = 0
    for batch in range(100):
        if mode == "spike" and batch % 25 == 12:
            loaded += load_batch(-batch, 640, 64 * 1024)
            time.sleep(0.02)
            _seen.clear()
        loaded += load_batch(batch, 48, 2048)
        if mode != "leak":
            _seen.clear()
        time.sleep(0.02)
    print(f"{loaded} rows loaded, {len(_seen)} digests held")


if __name__ == "__main__":
    main()
