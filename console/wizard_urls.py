"""URLs of the upload-and-deploy wizard, served under /wizard/ (the wizard's pages are added here)."""

app_name = "wizard"
urlpatterns: list = []
