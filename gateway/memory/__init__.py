"""What the agent remembers across sessions: memory files, recall, identities and facts."""
