"""The dashboard's table in the admin: the runs list's saved views."""

from __future__ import annotations

from django.contrib import admin

from .models import SavedView


@admin.register(SavedView)
class SavedViewAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "shared", "query", "updated_at")
    list_filter = ("shared",)
    search_fields = ("name", "owner__username", "query")
    raw_id_fields = ("owner",)
