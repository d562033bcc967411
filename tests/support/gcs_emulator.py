"""``gcp-storage-emulator`` with the one JSON API call it lacks and gcsfs uses: ``objects.moveTo``.

gcsfs moves an object with ``POST .../o/<src>/moveTo/o/<dst>`` and falls back to copy and delete
only after its retries of the emulator's 501 (some 30 s per move). Here the call is answered, as
a copy then a delete (GCS moves atomically; the tests do not rely on it), so that a move costs
what it costs on GCS. Run as ``python -m tests.support.gcs_emulator start ...`` (the emulator's own arguments).
"""

from __future__ import annotations

from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import Conflict, NotFound
from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.settings import API_ENDPOINT


def move(request, response, storage, *args, **kwargs) -> None:
    bucket, source, target = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
    try:
        moved = objects._copy(request.base_url, storage, bucket, source, bucket, target)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    except Conflict as err:
        objects._handle_conflict(response, err)
        return
    objects._delete(storage, bucket, source)
    response.json(moved)


MOVE_ROUTE = (
    rf"^{API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
    {"POST": move},
)
server.HANDLERS = (MOVE_ROUTE, *server.HANDLERS)  # before the generic object route, which would take it

if __name__ == "__main__":
    main()
