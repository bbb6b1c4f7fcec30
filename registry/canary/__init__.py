"""Canary analysis (SPEC §16): watch an adapter's canary against its active version on live
traffic and abort or promote it by itself.

Modules: ``policy`` (the adapter's ``canary_policy``), ``counters`` (per-version outcome counts
and TTFT sketches the gateways record; Redis layout), ``sketch`` (TTFT buckets), ``stats`` (the
one-sided tests), ``decide`` (one look: breach or not, with its evidence), ``actions`` (abort /
promote through the registry's state machine), ``lease`` (one analyser in the cluster),
``analyser`` (the loop), ``metrics`` (``loraplane_canary_*``), ``wiring`` (start it in a
process). This package imports nothing from ``gateway`` or ``router``; the gateway's recorder
(``gateway.canary``) writes what ``counters`` reads.
"""
