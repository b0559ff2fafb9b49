"""``python -m tracedx``: the command line (so that ``torchrun -m tracedx capture ...`` works)."""

from tracedx.cli import main

if __name__ == "__main__":  # pragma: no cover - the entry point itself
    main(prog_name="tracedx")
