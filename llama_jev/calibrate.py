"""``python -m llama_jev.calibrate``: runs the calibration CLI (:mod:`llama_jev.calibration.cli`).

The command keeps its name; the code lives beside the rest of calibration, so this module is only
the command's entry point and never stands in for the ``calibrate`` function
(:func:`llama_jev.calibration.calibrate`).
"""

import sys

from llama_jev.calibration.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
