"""Trust: signed artifacts, the fleet trust root, device identity and attestation.

Modules: ``envelopes`` (DSSE + canonical JSON), ``documents`` (root, artifact metadata,
rollback allowance), ``versions`` (version order), ``verifying`` (the pure checks),
``admitting`` (the gate in front of the artifact store), ``signing`` (publisher side),
``identity`` (device key, TPM or file; CSR), ``attesting`` (evidence and its verifier).
See docs/trust.md.
"""
