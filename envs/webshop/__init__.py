"""WebShop: a text e-commerce simulator (search, result pages, item pages with options, buy), WebShop's purchase
reward, a loader for WebShop's JSON files and the generated catalog shipped with orch."""

from envs.webshop.env import WebShopConfig, WebShopEnv

__all__ = ["WebShopConfig", "WebShopEnv"]
