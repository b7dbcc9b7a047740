"""Email on aioimaplib and aiosmtplib: a mailbox read over IMAP (IDLE, polling as fallback), replies by SMTP.

Modules: ``adapter`` (lifecycle, inbound delivery, sending), ``mailbox`` (the IMAP
loop: a message taken once, flagged only after it was stored), ``message``
(a mail -> InboundMessage: strict sender, loop guards, threads, quoted history and
signatures stripped, attachments), ``compose`` (the reply: text plus HTML from the
model's Markdown, threaded), ``outbound`` (SMTP submission, retried), ``config``
(the ``platforms.email`` settings).
"""

from adapters import lazy_exports

from .config import EmailConfig

__all__ = ["EmailAdapter", "EmailConfig"]
__getattr__ = lazy_exports(__name__, {"EmailAdapter": ".adapter"})
