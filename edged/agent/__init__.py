"""edged updates itself (issue 32, docs/agent-updates.md): the device side of agent releases.

The launcher (:mod:`edged.launcher`) runs a slot on trial and commits or rolls back; this
package installs a verified release into the inactive slot, smoke-tests it, asks the launcher
to switch, decides when a trial is healthy enough to commit, and reports where it stands.
"""
