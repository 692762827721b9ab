"""The hub's controllers: each reacts to changes of the objects it owns and acts
on the state wing, through a work queue of keys (docs/hub.md, "Controllers per key")."""
