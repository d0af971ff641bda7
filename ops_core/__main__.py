"""python -m dsa_ops {info,demo,gates}"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv else "info"
    if cmd == "info":
        from .info import main as run
    elif cmd == "demo":
        from .demo import main as run
    elif cmd == "gates":
        from .gates import main as run
    else:
        print("usage: python -m dsa_ops {info|demo|gates} [options]", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
