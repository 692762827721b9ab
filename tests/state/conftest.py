"""Persisted desired state in real files under ``tmp_path``; manifests parsed for real.

Nothing is faked: atomic writes, reads and corrupt files are plain files on disk. Merging
the sources is pure and tested as a table, with no files at all.
"""
