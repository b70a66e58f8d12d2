"""The console: server-rendered pages for people (overview, models, deployments, teams, the wizard).

An edge like `conch/`: its views translate a request into calls of the apps' services and render templates;
they hold no business rule of their own.
"""
