"""`python -m gpucluster` runs the same CLI as the console script."""

from __future__ import annotations

from gpucluster.cli.main import main

if __name__ == "__main__":
    main()
