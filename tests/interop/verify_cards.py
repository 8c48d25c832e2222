"""Checks agent card signatures with the official A2A Python SDK's verifier.

Usage: python verify_cards.py JWKS_FILE CARD_FILE...

Each card file holds one card as the server served it (the 1.0 card with
the 0.3 fields beside it), read as the SDK's client reads a fetched card
(a2a.client.card_resolver.parse_agent_card). Every card must verify
(a2a.utils.signing.create_signature_verifier, spec section 8.4.3) with a
key of the JWK set, found by the `kid` of the signature's protected
header. Prints "verified <file>" per card; exits 1
at the first card that does not verify. Run by tests/card_signing.rs when
A2A_TEST_PYTHON names a Python with `a2a-sdk[signing]`.
"""

import json
import sys

from jwt.api_jwk import PyJWK

from a2a.client.card_resolver import parse_agent_card
from a2a.utils.signing import create_signature_verifier


def main() -> int:
    jwks_file, *card_files = sys.argv[1:]
    with open(jwks_file) as f:
        keys = {key["kid"]: PyJWK(key) for key in json.load(f)["keys"]}

    def key_provider(kid, jku):
        return keys[kid]

    verify = create_signature_verifier(
        key_provider, ["ES256", "ES384", "RS256", "EdDSA"]
    )
    for path in card_files:
        with open(path) as f:
            card = parse_agent_card(json.load(f))
        try:
            verify(card)
        except Exception as e:  # the verifier's own error, named in full
            print(f"NOT verified {path}: {type(e).__name__}: {e}")
            return 1
        print(f"verified {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
