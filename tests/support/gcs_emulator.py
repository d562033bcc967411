"""``gcp-storage-emulator`` with the calls it lacks that gcsfs and delta-rs (object_store) make.

gcsfs moves an object with ``POST .../o/<src>/moveTo/o/<dst>`` and falls back to copy and delete
only after its retries of the emulator's 501 (some 30 s per move). Here the call is answered, as
a copy then a delete (GCS moves atomically; the tests do not rely on it), so that a move costs
what it costs on GCS.

delta-rs reaches GCS through object_store, which speaks GCS's XML API: it lists a bucket with
``GET /<bucket>?list-type=2`` (501 here), reads objects with ``GET`` and ``HEAD /<bucket>/<name>``
and needs their ``ETag``, ``Last-Modified`` and ``x-goog-generation`` headers (the emulator sends
none and has no HEAD), and creates a Delta log version with ``PUT /<bucket>/<name>`` and
``x-goog-if-generation-match: 0``, which the emulator ignores. Those calls are answered here as
GCS documents them (https://cloud.google.com/storage/docs/xml-api/reference-methods), the
precondition included: a create of an existing object answers 412 Precondition Failed, as GCS
does. (The JSON API's ``ifGenerationMatch``, which gcsfs sends, stays ignored, as the emulator
has it: tests/test_object_stores.py checks that gcsfs sends it.)

Run as ``python -m tests.support.gcs_emulator start ...`` (the emulator's own arguments).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import format_datetime
from http import HTTPStatus
from urllib.parse import unquote, urlparse
from xml.sax.saxutils import escape

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


# --- the XML API calls of object_store (delta-rs) ---------------------------------------------------------

#: object_store percent-encodes the bucket's name too (``raybatch%2Dtest``): ``%`` is let in.
XML_OBJECT = r"^/(?P<bucket_name>[-.%\w]+)/(?P<object_id>.*[^/]+)$"
XML_BUCKET = r"^/(?P<bucket_name>[-.%\w]+)$"
#: The emulator's own XML object route, which these replace.
EMULATOR_XML_OBJECT = r"^/(?P<bucket_name>[-.\w]+)/(?P<object_id>.*[^/]+)$"


def _object_headers(obj: dict) -> dict[str, str]:
    """The headers GCS's XML API sends with an object (object_store requires the first three)."""
    updated = datetime.fromisoformat(obj["updated"].replace("Z", "+00:00")).astimezone(UTC)
    return {
        "ETag": f'"{obj.get("etag") or obj.get("md5Hash")}"',
        "Last-Modified": format_datetime(updated, usegmt=True),
        "x-goog-generation": str(obj["generation"]),
        "x-goog-stored-content-length": str(obj["size"]),
    }


def xml_get(request, response, storage, *args, **kwargs) -> None:
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    for name, value in _object_headers(obj).items():
        response[name] = value
    objects.download(request, response, storage)


def xml_put(request, response, storage, *args, **kwargs) -> None:
    """An upload, or a create (``x-goog-if-generation-match: 0``) refused with 412 if the object exists."""
    bucket, name = request.params["bucket_name"], request.params["object_id"]
    if request.get_header("x-goog-copy-source"):
        response.status = HTTPStatus.NOT_IMPLEMENTED  # a copy: not needed by the tests, so loud
        return
    handler = request._request_handler  # the raw body: the emulator's reader parses JSON bodies
    body = server._decode_raw_data(server._read_raw_data(handler), handler) or b""
    expected = request.get_header("x-goog-if-generation-match")
    if expected is not None:
        try:
            current = str(storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            current = "0"  # GCS: generation 0 matches only an absent object
        if expected != current:
            response.status = HTTPStatus.PRECONDITION_FAILED
            return
    content_type = request.get_header("Content-Type", "application/octet-stream")
    obj = objects._make_object_resource(request.base_url, bucket, name, content_type, str(len(body)))
    obj = objects._checksums(body, obj)
    try:
        storage.create_file(bucket, name, body, obj)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    for header, value in _object_headers(obj).items():
        response[header] = value


def xml_list(request, response, storage, *args, **kwargs) -> None:
    """``GET /<bucket>?list-type=2``: a ListBucketResult, in one page (no continuation token)."""
    if request.query.get("list-type") != ["2"]:
        response.status = HTTPStatus.NOT_IMPLEMENTED
        return
    first = {k: v[0] for k, v in request.query.items()}
    prefix, delimiter, after = first.get("prefix", ""), first.get("delimiter"), first.get("start-after", "")
    try:
        found, prefixes = storage.get_file_list(request.params["bucket_name"], prefix or None, delimiter)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    found = [obj for obj in found if obj["name"] > after]
    contents = "".join(
        f"<Contents><Key>{escape(obj['name'])}</Key><Size>{obj['size']}</Size>"
        f"<LastModified>{obj['updated']}</LastModified><ETag>{escape(_object_headers(obj)['ETag'])}</ETag></Contents>"
        for obj in found
    )
    common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
    response["Content-type"] = "application/xml"
    response.write_file(
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
        f"<Name>{escape(request.params['bucket_name'])}</Name><Prefix>{escape(prefix)}</Prefix>"
        f"<KeyCount>{len(found) + len(prefixes)}</KeyCount><IsTruncated>false</IsTruncated>{contents}{common}"
        "</ListBucketResult>".encode(),
        content_type="application/xml",
    )


def do_head(handler) -> None:
    """``HEAD /<bucket>/<name>``: an object's headers, no body (the emulator has no HEAD at all)."""
    match = re.fullmatch(XML_OBJECT, urlparse(handler.path).path)
    try:
        if match is None:
            raise NotFound
        obj = handler.storage.get_file_obj(unquote(match["bucket_name"]), unquote(match["object_id"]))
    except NotFound:
        handler.send_response(HTTPStatus.NOT_FOUND)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return
    handler.send_response(HTTPStatus.OK)
    for name, value in {**_object_headers(obj), "Content-Length": str(obj["size"])}.items():
        handler.send_header(name, value)
    handler.send_header("Content-Type", obj.get("contentType") or "application/octet-stream")
    handler.end_headers()


# The emulator's own XML object route is the last (every JSON API path would match it): replaced in place.
assert server.HANDLERS[-1][0] == EMULATOR_XML_OBJECT, "gcp-storage-emulator's routes changed: check the XML API routes"
server.HANDLERS = (
    *server.HANDLERS[:-1],
    (XML_OBJECT, {"GET": xml_get, "PUT": xml_put}),
    (XML_BUCKET, {"GET": xml_list}),
)
server.RequestHandler.do_HEAD = do_head

if __name__ == "__main__":
    main()
