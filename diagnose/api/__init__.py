"""diagnose's Python API (docs/api.md): capture a bundle, analyse it, write its report or its JSON document.

    from diagnose import api

    bundle = api.capture(url="http://127.0.0.1:8000", concurrency=8, duration="20s", output="run1")
    analysis = api.analyze(bundle)            # diagnose.analysis.Analysis: typed and frozen
    api.report(analysis, "run1.html")         # the HTML report `diagnose analyze -o` writes
    doc = api.document(analysis)              # the `analyze --json` document, as a dict

``capture`` runs what ``diagnose attach`` runs, in this process: every attach option is a keyword argument by its
Python name (``--input-tokens`` is ``input_tokens``, ``--no-nvml`` is ``nvml=False``), checked by the same code
and refused with the same one-line messages, raised as :mod:`diagnose.errors` exceptions instead of printed.
Progress lines go to stderr as on the command line. ``analyze`` is ``diagnose analyze``'s analysis
(diagnose.pipeline.analyze) without writing anything.
"""

from __future__ import annotations

from diagnose.api.analysis import analyze, document, report
from diagnose.api.capture import CaptureFailed, attach_options, capture

__all__ = ["CaptureFailed", "analyze", "attach_options", "capture", "document", "report"]
