"""Files on local disks and object stores: which store a URL is on, reads and writes through
fsspec that settle unknown outcomes, and bounded retries of transient store errors."""
