"""Accounting: custom events and their rules, neighbouring relations, accountants, the privacy ledger and its file."""
