"""Encryption at rest for secrets Conch must keep and use later (a cluster's kubeconfig), with Fernet.

Fernet (`cryptography`) gives authenticated symmetric encryption (AES-128-CBC with HMAC-SHA256). The keys come
from `CONCH_FIELD_ENCRYPTION_KEYS`: comma-separated Fernet keys, the first one encrypting, all of them decrypting
(so a key can be rotated: put the new one first, re-save, then drop the old one). Without the variable the key is
derived from `DJANGO_SECRET_KEY`, so changing that key makes stored secrets unreadable until they are registered
again.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from conch.errors import ConchError

__all__ = ["SecretUnreadable", "decrypt_text", "encrypt_text", "generate_key"]


class SecretUnreadable(ConchError):
    """A stored secret cannot be decrypted with the configured keys (HTTP 500: an operator must act)."""

    status_code = 500


def generate_key() -> str:
    """A new random Fernet key (44 URL-safe base64 characters) for `CONCH_FIELD_ENCRYPTION_KEYS`."""
    return Fernet.generate_key().decode()


def _box() -> MultiFernet:
    configured = [key.strip() for key in settings.CONCH_FIELD_ENCRYPTION_KEYS if key.strip()]
    if not configured:
        digest = hashlib.sha256(b"conch.field-encryption.v1:" + settings.SECRET_KEY.encode()).digest()
        configured = [base64.urlsafe_b64encode(digest).decode()]
    return MultiFernet([Fernet(key.encode()) for key in configured])


def encrypt_text(plain: str) -> str:
    """Encrypt `plain` (UTF-8 text) with the first configured key; returns the Fernet token as text."""
    return _box().encrypt(plain.encode()).decode()


def decrypt_text(token: str) -> str:
    """Decrypt a token made by `encrypt_text`. Raises SecretUnreadable when no configured key opens it."""
    try:
        return _box().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(
            "A stored secret cannot be decrypted with the keys in CONCH_FIELD_ENCRYPTION_KEYS (or, without them, "
            "with the key derived from DJANGO_SECRET_KEY, which may have changed). Put the old key back, or "
            "register the secret again."
        ) from None
