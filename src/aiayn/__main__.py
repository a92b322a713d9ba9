"""`python -m aiayn ...` (and `torchrun -m aiayn train ...`)."""

from aiayn.cli.main import main

if __name__ == "__main__":
    main()
