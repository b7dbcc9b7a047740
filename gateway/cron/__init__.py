"""Scheduled jobs: definitions and schedules, and the service that runs them in the daemon."""
