"""The local Ray an embedded task runs on: a per-task Ray with its reaper, or the host's shared
warm Ray (:mod:`.shared`); and how the provider's command lines end their process."""
