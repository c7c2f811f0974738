# Batch importer keeping failed chunks' exceptions, whose tracebacks keep each frame's ~96 KiB chunk alive. Variants: leak | fixed (keeps a one-line summary string instead).
import sys
import time
import traceback

RECORD = b"id=000123;name=Jane Doe;email=jane@example.com;plan=pro;\n"


def read_chunk(n):
    return b"CHUNK %06d\n" % n + RECORD * (96 * 1024 // len(RECORD))  # LEAK-SITE


def import_chunk(n):
    chunk = read_chunk(n)
    records = chunk.count(b"\n") - 1
    if n % 2:
        raise ValueError(f"chunk {n}: record {records // 2} has no email domain")
    return records


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    if mode not in ("leak", "fixed"):
        sys.exit(f"usage: {sys.argv[0]} leak|fixed")
    failures = []
    imported = 0
    for n in range(200):
        try:
            imported += import_chunk(n)
        except ValueError as exc:
            if mode == "leak":
                failures.append(exc)
            else:
                failures.append("".join(traceback.format_exception_only(exc)).strip())
        if n % 2:
            time.sleep(0.02)
    print(f"{imported} records imported, {len(failures)} chunks failed")


if __name__ == "__main__":
    main()
