"""``python -m simulator --port P --model NAME …`` (same flags as ``loraplane simulate``)."""

from simulator.cli import main

if __name__ == "__main__":
    main()
