"""Response generation: one answer per question, optionally from its background texts only
(``framework``); the answer generator the ELI5 study builds on."""
