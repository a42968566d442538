"""Speculative decoding: drafters behind one protocol, lossless verification, the draft policy.

`config.SpeculativeConfig` says which drafter runs; `drafter.Drafter` is the protocol every
drafter implements (the MTP head, n-gram lookup, a draft model, or a plug-in such as the
benchmark oracle); `speculator.Speculator` is what the engine talks to.
"""
