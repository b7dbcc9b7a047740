"""The platform adapters, one package per platform on its real library.

Their errors derive from ``gateway.errors.AdapterError`` (drawn in :mod:`gateway.errors`):

    AdapterError                     a platform adapter could not start or deliver
    ├── PlatformHTTPError            (gateway.errors) the platform answered with an error status
    ├── RateLimited                  (gateway.errors) the platform said "wait retry_after seconds"
    ├── NotConnected                 discord/outbound.py: no logged-in client right now
    │                                (starting or reconnecting); the send is retried
    ├── _Fatal                       discord/adapter.py, internal: a start failure retrying cannot
    │                                fix (bad token, missing intent); its message says what to change
    └── PartFailed                   slack/outbound.py: one part of a reply was not delivered; the
                                     adapter reports a failed Delivery with the reason

An adapter's start raises ``AdapterError`` with a message naming the config key
to fix; a send never raises: it returns a ``Delivery`` that says what failed.
"""
