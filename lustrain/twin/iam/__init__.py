"""IAM as AWS enforces it, in the twin: policy evaluation (`policy`), the authorizations each API call needs
from the Service Authorization Reference (`actions`), and their enforcement on every call a role makes
(`enforce`), read against moto's live state (`world`)."""
