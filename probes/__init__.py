"""Probes gather evidence from a running engine. Each writes its own streams into the capture bundle.

Probes know nothing of rules or reports. Heavy or hardware imports (torch, pynvml, py-spy) happen inside
the probe that needs them, so analysis runs anywhere.
"""
