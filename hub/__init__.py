"""hub: the edgefleet regional control plane.

Built so far: the store (:mod:`hub.store`), the CA (:mod:`hub.pki`), bootstrap tokens
(:mod:`hub.tokens`), the config file (:mod:`hub.config`), ``hub init`` and ``hub token``
(:mod:`hub.cli`), and the gRPC API in ``proto/edgefleet/v1`` (stubs in :mod:`edgefleet.v1`).
"""
