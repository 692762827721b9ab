"""A regional hub's side of federation (docs/federation.md): its enrollment with the root
(:mod:`.regionenrollment`), the link that streams the root's slices in and the region's status
up (:mod:`.link`), what applying a slice writes (:mod:`.sliceapply`), the root's TUF metadata
served (:mod:`.tufadoption`) and the region's report (:mod:`.regionreport`)."""
