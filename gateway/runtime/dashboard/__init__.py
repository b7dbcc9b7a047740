"""The web dashboard at ``/ui/`` on the local API's listener: Health, Sessions, Cron, Usage, Pairing.

Server-rendered HTML (Jinja2 templates and one stylesheet and one small script, all shipped in this
package: no build step, no CDN, no inline script).  Off unless ``ui.enabled: true``; who may see and
change what is in :mod:`gateway.runtime.dashboard.guard`.

    GET  /ui/                                 Health (refreshes its panel from /ui/health/fragment)
    GET  /ui/sessions?platform=&user=&title=&since=&until=&q=&page=
    GET  /ui/sessions/{id}                    transcript, lineage, compression summary
    GET  /ui/sessions/{id}/export.json|.md
    GET  /ui/cron, /ui/cron/{job}             jobs, next run, history
    GET  /ui/cron/runs/fragment, /ui/cron/{job}/runs/fragment   the runs table (refreshed while one runs)
    POST /ui/cron/{job}/run|pause|resume
    GET  /ui/pairing                          pending codes, approved users
    POST /ui/pairing/approve, /ui/pairing/revoke
    GET  /ui/login, POST /ui/login, POST /ui/logout
    GET  /ui/static/{file}
"""

from gateway.runtime.dashboard.app import Dashboard, DashboardSettings
from gateway.runtime.dashboard.pages import Pages, Sources

__all__ = ["Dashboard", "DashboardSettings", "Pages", "Sources"]
