"""The search: baseline policies, proposals and the bounded local optimizer over complete builds."""
