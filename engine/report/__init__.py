"""``kvpolicy report``: one self-contained HTML page for a person reviewing a policy change."""
